"""The shared user model of layout (b): global users, each linked to the tenants it belongs to
as django-tenant-users' ``UserProfile.tenants`` links them (``related_name="user_set"``)."""

from __future__ import annotations

from django.contrib.auth.models import AbstractUser
from django.db import models


class Member(AbstractUser):
    """A user of every tenant's domain; a member only of the tenants in ``tenants``."""

    tenants = models.ManyToManyField(
        "customers.Client", blank=True, related_name="user_set", help_text="Its tenants."
    )
