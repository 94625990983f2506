"""A tenant app: every tenant has its own invoices table in its own schema."""

from __future__ import annotations

from django.db import models


class Customer(models.Model):
    name = models.CharField(max_length=100)
    email = models.EmailField(blank=True)

    def __str__(self) -> str:
        return self.name


class Invoice(models.Model):
    number = models.CharField(max_length=20, unique=True)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    synced_at = models.DateTimeField(null=True, blank=True)
    sync_attempts = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return self.number


class ActivityLog(models.Model):
    """Written by jobs; shows which schema a run wrote to."""

    job = models.CharField(max_length=100)
    message = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.job}: {self.message}"
