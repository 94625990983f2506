from __future__ import annotations

from django.apps import AppConfig


class GuardSharedConfig(AppConfig):
    name = "tests.guardapp.shared"
    label = "guardapp_shared"
    default_auto_field = "django.db.models.BigAutoField"
