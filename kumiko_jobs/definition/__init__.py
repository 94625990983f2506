"""What a job is and when it runs (options, cron expressions); imports only the foundation."""
