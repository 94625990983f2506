"""Run history in the Django admin: one site, two audiences.

On the public schema's domain the admin is the **operator** view: every tenant's runs with
payload, errors, tracebacks, attempts and log lines, and the actions retry, cancel and "run a
job". On a tenant's domain the same admin site shows the **tenant** view: only that tenant's
runs and failures, and only the fields a tenant may read (job, subject, status, times, and
failure messages rendered from their message keys through Django's i18n); its members holding
``kumiko_jobs.operate_tenant_runs`` retry and cancel its runs, and no other tenant's.

The view is decided per request from ``connection.schema_name`` (set by django-tenants'
middleware): a tenant superuser on its domain is still a tenant. The user must belong to the
view's audience (``audiences``, core/audience.py): the operators' view takes
``kumiko_jobs.view_all_tenants``, a tenant's view membership of that tenant (implied when users
live in the tenants' schemas, else ``KUMIKO_JOBS["TENANT_MEMBERSHIP"]``). Django's model
permissions govern each page on top of that.

Django's autodiscover imports this package; importing ``runs`` and ``other_models`` below
registers the admins (``@admin.register``). One concern per module: ``render`` (how values
look), ``filters``, ``pagination`` and ``search`` (lists of millions of rows),
``query_strings``, ``audiences`` (who sees what), ``display``, ``actions``, ``bulk`` (retry or
cancel every run a filter matches), ``run_job``,
``runs`` (JobRunAdmin, composed of those), ``other_models`` and ``checks`` (the audiences'
system checks).
"""

from __future__ import annotations

# Runs first, as in the single module this package replaces: the order of registration is the
# order of the admin's URL patterns and of its system checks.
from .runs import JobRunAdmin

# isort: split
from .bulk import BulkOperationAdmin
from .display import JobAttemptInline
from .other_models import EscapeHatchUseAdmin, JobFailureAdmin, RejectedMessageAdmin
from .pauses import FlowPauseAdmin
from .workflows import WorkflowAdmin

# isort: split
# Registers the audience checks (E014, E015) with the admin that they are about.
from . import checks as checks

# The admin classes keep their old dotted paths (kumiko_jobs.admin.JobRunAdmin, ...): users'
# code may subclass or unregister them. Tunables such as MAX_PAGES are deliberately not
# re-exported: a patch of MAX_PAGES on this package would change nothing that reads it.
__all__ = [
    "BulkOperationAdmin",
    "EscapeHatchUseAdmin",
    "FlowPauseAdmin",
    "JobAttemptInline",
    "JobFailureAdmin",
    "JobRunAdmin",
    "RejectedMessageAdmin",
    "WorkflowAdmin",
]
