from __future__ import annotations

from django.apps import AppConfig


class GuardAppConfig(AppConfig):
    name = "tests.guardapp"
    label = "guardapp"
    default_auto_field = "django.db.models.BigAutoField"
