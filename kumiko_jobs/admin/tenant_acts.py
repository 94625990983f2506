"""Which of its tenant's runs a tenant's member may retry or cancel (``operate_tenant_runs``, on
the tenant's domain; admin/actions.py asks before each act, the run page before each button).

The permission reaches the tenant's runs, not every run: some are the operators' to handle. A
member is refused, failing closed:

* a run whose job is no longer registered: nothing says the job let tenants act on it;
* a run of a job declared ``@job(tenant_operable=False)`` (a per-tenant billing cron, say);
* the retry of a cancelled run that no member of this tenant cancelled: an operator's cancel
  (or the CLI's, a workflow's, a newer enqueue's under ``concurrency="replace"``) stands until
  an operator undoes it;
* a run an operator started: by hand (the "Run a job" page: trigger ``manual by <who>``, or
  ``manual`` with nobody to name; the CLI's ``enqueue``: ``manual by manage.py (<login>)``) or
  as the retry of another run (``retry:<id> by <who>``, the author not a member of this tenant:
  an operator's in the admin, the bulk page's, the CLI's ``manage.py (<login>)``). The
  operators' start, like their cancel, stands until an operator acts on it. A retry with no
  author (project code calling ``retry_run`` outside a request) stays the tenant's.

Who cancelled is the run's ``cancel_requested_by``: a tenant's member's act records
``<username> (tenant <schema>)`` (``member_label``), every other canceller something else. A
running run keeps the first request's author, so a member's request that came first makes the
run the tenant's to retry even if an operator asked too.

Operators (the public schema's domain) are never refused here.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

from ..definition.registry import registry
from ..models import JobRun, RunStatus

RETRY, CANCEL = "retry", "cancel"


@dataclass(frozen=True)
class Refusal:
    """Why a member may not act on a run: ``reason`` ends the list's "n skipped: <reason>",
    ``sentence`` stands on the run's page where its button would be."""

    reason: Promise
    sentence: Promise


UNREGISTERED = Refusal(
    reason=_("job no longer registered"),
    sentence=_(
        "This run's job is no longer registered, so only the operators may retry or cancel it."
    ),
)
OPERATORS_ONLY = Refusal(
    reason=_("only operators retry or cancel this job's runs"),
    sentence=_("Only the operators retry or cancel the runs of this job."),
)
OPERATOR_STARTED = Refusal(
    reason=_("started by an operator"),
    sentence=_("An operator started this run, so only the operators may retry or cancel it."),
)
NOT_THEIR_CANCEL = Refusal(
    reason=_("not cancelled by a member of this tenant"),
    sentence=_(
        "This run was not cancelled by a member of this tenant, so only the operators may retry it."
    ),
)


def member_label(name: str, schema: str, limit: int) -> str:
    """How the history records a tenant's member (a retry's trigger, a cancel's author): the
    username shortened to fit ``limit`` with the tenant's schema, which always stays whole."""
    suffix = _suffix(schema)
    return f"{name[: max(0, limit - len(suffix))]}{suffix}"


def refusal(run: JobRun, kind: str, schema: str) -> Refusal | None:
    """Why a member of ``schema``'s tenant may not ``kind`` (``"retry"``, ``"cancel"``) this run
    of that tenant, or None when it may (whether the run's status allows the act is the
    operation's to decide)."""
    refused = job_refusal(run.job_name)
    if refused is not None:
        return refused
    if started_by_operator(run, schema):
        return OPERATOR_STARTED
    if kind == RETRY and run.status == RunStatus.CANCELLED and not cancelled_by_member(run, schema):
        return NOT_THEIR_CANCEL
    return None


def job_refusal(job_name: str) -> Refusal | None:
    """The refusal that holds for every run of ``job_name`` and both acts (the job is no longer
    registered, or is ``tenant_operable=False``), or None. It reads the registry only, so the
    run list asks it for every row at no cost in SQL (the row's action checkbox)."""
    if job_name not in registry:
        return UNREGISTERED
    if not registry.get(job_name).tenant_operable:
        return OPERATORS_ONLY
    return None


def started_by_operator(run: JobRun, schema: str) -> bool:
    """Whether an operator started this run: by hand, or as a retry whose author is not a
    member of ``schema``'s tenant (operations.py writes both triggers)."""
    trigger = run.trigger
    if trigger == "manual" or trigger.startswith("manual by "):
        return True
    if not trigger.startswith("retry:") or " by " not in trigger:
        return False
    return not (bool(schema) and trigger.endswith(_suffix(schema)))


def cancelled_by_member(run: JobRun, schema: str) -> bool:
    """Whether a member of ``schema``'s tenant asked for this run's cancellation (the first to
    ask, for a running run)."""
    return bool(schema) and run.cancel_requested_by.endswith(_suffix(schema))


def _suffix(schema: str) -> str:
    return f" (tenant {schema})"
