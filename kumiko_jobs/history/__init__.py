"""Run history in PostgreSQL; imports models and the foundation, never the run or worker side."""
