"""Run history in the Django admin: one site, two audiences.

On the public schema's domain the admin is the **operator** view: every tenant's runs with
payload, errors, tracebacks, attempts and log lines, and the actions retry, cancel and "run a
job". On a tenant's domain the same admin site shows the **tenant** view: only that tenant's
runs and failures, and only the fields a tenant may read (job, subject, status, times, and
failure messages rendered from their message keys through Django's i18n).

The audience is decided per request from ``connection.schema_name`` (set by django-tenants'
middleware), never from the user: a tenant superuser is still a tenant. Django's model
permissions govern access in both places; tenants' users and permissions live in their schema.

Django's autodiscover imports this package; importing ``runs`` and ``other_models`` below
registers the admins (``@admin.register``). One concern per module: ``render`` (how values
look), ``filters``, ``pagination`` and ``search`` (lists of millions of rows),
``query_strings``, ``audiences`` (who sees what), ``display``, ``actions``, ``run_job``,
``runs`` (JobRunAdmin, composed of those) and ``other_models``.
"""

from __future__ import annotations

# Runs first, as in the single module this package replaces: the order of registration is the
# order of the admin's URL patterns and of its system checks.
from .runs import JobRunAdmin

# isort: split
from .display import JobAttemptInline
from .other_models import EscapeHatchUseAdmin, JobFailureAdmin, RejectedMessageAdmin
from .pauses import FlowPauseAdmin

# The admin classes keep their old dotted paths (kumiko_jobs.admin.JobRunAdmin, ...): users'
# code may subclass or unregister them. Tunables such as MAX_PAGES are deliberately not
# re-exported: a patch of kumiko_jobs.admin.MAX_PAGES would change nothing that reads it.
__all__ = [
    "EscapeHatchUseAdmin",
    "FlowPauseAdmin",
    "JobAttemptInline",
    "JobFailureAdmin",
    "JobRunAdmin",
    "RejectedMessageAdmin",
]
