"""test_chaos_cron's job: the shortest crontab there is (every second), a system job on "low"."""

from __future__ import annotations

from kumiko_jobs import job


@job(cron="* * * * * * *", system=True, queue="low")
def every_second(ctx) -> None:
    """Its ticks are what the test counts: one run row per second, none missed, none doubled."""
