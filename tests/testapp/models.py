"""A tenant table that test jobs write, so tests can see which schema a run used."""

from __future__ import annotations

from django.db import models


class Probe(models.Model):
    tag = models.CharField(max_length=100)
    schema_seen = models.CharField(max_length=63)
    attempt = models.PositiveIntegerField(default=1)
    note = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"{self.tag}@{self.schema_seen}"
