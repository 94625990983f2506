from __future__ import annotations

from django.apps import AppConfig


class ChaosCronConfig(AppConfig):
    """The app that holds test_chaos_cron's every-second cron job."""

    name = "tests.chaos.cron_app"
    label = "chaos_cron"
