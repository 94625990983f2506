from __future__ import annotations

from django.apps import AppConfig


class CustomersConfig(AppConfig):
    name = "example_project.customers"
    label = "customers"
