"""Tenant tables of the guard suites (every tenant schema has its own copy)."""

from __future__ import annotations

from django.db import models


class Secret(models.Model):
    """A row each tenant owns; the attack suite tries to reach t2's from a run in t1."""

    label = models.CharField(max_length=50)
    value = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.label


class Person(models.Model):
    """A table with a personal-data column: anonymous origins may not write ``email``."""

    name = models.CharField(max_length=100)
    email = models.CharField(max_length=200, blank=True)

    kumiko_personal_data = ["email"]

    def __str__(self) -> str:
        return self.name


class Finding(models.Model):
    """What a job observed, written in its own tenant for the test to read."""

    key = models.CharField(max_length=100)
    value = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


class Contact(models.Model):
    """A tenant table and a personal-data column whose names have upper-case letters (Django
    quotes both): the personal-data rule must match them as PostgreSQL spells them."""

    name = models.CharField(max_length=100)
    email = models.CharField(max_length=200, blank=True, db_column="Email")

    kumiko_personal_data = ["email"]

    class Meta:
        db_table = "GuardApp_Contact"

    def __str__(self) -> str:
        return self.name
