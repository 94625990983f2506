"""Shared tables of the guard suites (public only)."""

from __future__ import annotations

from django.db import models


class Notice(models.Model):
    """A shared table whose name has upper-case letters: Django quotes it, so PostgreSQL keeps
    ``GuardShared_Notice`` as written, and a tenant run writes it only with global_writes."""

    text = models.CharField(max_length=100)

    class Meta:
        db_table = "GuardShared_Notice"

    def __str__(self) -> str:
        return self.text
