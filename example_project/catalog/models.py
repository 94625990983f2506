"""A shared (public-schema) table: every tenant reads it, only declared jobs write it."""

from __future__ import annotations

from django.db import models


class Plan(models.Model):
    name = models.CharField(max_length=50, unique=True)
    monthly_price = models.DecimalField(max_digits=8, decimal_places=2)

    def __str__(self) -> str:
        return self.name
