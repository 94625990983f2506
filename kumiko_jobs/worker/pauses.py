"""Pause and resume at runtime, cluster-wide: a queue, a job, a tenant, or a job in one tenant.

A pause is a ``FlowPause`` row (the truth) and a member of one of the Redis sets the fair
dequeue reads (``transport/pausing.py``): the dequeue then skips what is paused, so paused
runs wait where they are, in their order, without a worker polling them or an attempt
spent, and resume where they were. Nothing is moved between PostgreSQL and Redis: the
messages stay in Redis (parked or held by the dequeue), and the relay does not push them
again (RQ still holds them, queued). A paused tenant's cron ticks and fan-out children are
messages in its bucket, so they wait too, and so do the system runs its runs started
(``@job(system=True, tenant_may_start=True)``, filed in its bucket: ``Envelope.flow_tenant``).
The operators' admin (``FlowPauseAdmin``) and ``manage.py kumiko_jobs pause|resume`` call
``pause`` and ``resume``; every maintenance round calls ``assert_pauses`` so that Redis says
what PostgreSQL says after a failover or a flush.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import IntegrityError, transaction
from django.utils.translation import gettext
from django_tenants.utils import get_tenant_model

from .. import transport
from ..core import conf, project_settings
from ..core.exceptions import JobNotRegistered
from ..definition.registry import registry
from ..history.transitions import PAUSED_BY_LIMIT
from ..models import FlowPause, JobRun, RunStatus

logger = logging.getLogger("kumiko_jobs.worker")


class PauseRefused(ValueError):
    """A pause or resume that names nothing real, or too much at once; says what to pass."""


def check(queue: str = "", job: str = "", tenant: str = "") -> None:
    """Raise ``PauseRefused`` unless this names one queue, one job, one tenant, or one job in
    one tenant, each of which exists."""
    if queue and (job or tenant):
        raise PauseRefused(
            "pause a queue on its own (--queue), or a job and/or a tenant (--job, --tenant): "
            "a queue pause already holds every job and tenant on it."
        )
    if not (queue or job or tenant):
        raise PauseRefused("name what to pause: --queue NAME, --job NAME, --tenant SCHEMA.")
    if queue and queue not in project_settings.rq_queue_names():
        known = ", ".join(project_settings.rq_queue_names())
        raise PauseRefused(f"no queue {queue!r} in RQ_QUEUES (queues: {known}).")
    if job:
        try:
            registry.get(job)
        except JobNotRegistered as exc:
            raise PauseRefused(f"{exc} Pause a registered job by its name.") from None
    if tenant and not get_tenant_model().objects.filter(schema_name=tenant).exists():
        raise PauseRefused(f"no tenant with schema {tenant!r}; pass a tenant's schema name.")


def pause(queue: str = "", job: str = "", tenant: str = "", by: str = "") -> bool:
    """Pause it (False: it was paused already). Effective at the next dequeue anywhere."""
    check(queue, job, tenant)
    try:
        with transaction.atomic():
            FlowPause.objects.create(
                queue=queue, job_name=job, schema_name=tenant, paused_by=by[:PAUSED_BY_LIMIT]
            )
        created = True
    except IntegrityError:
        created = False
    assert_pauses()
    return created


def resume(queue: str = "", job: str = "", tenant: str = "") -> bool:
    """Resume it (False: it was not paused); its runs go on where they were, in order."""
    check(queue, job, tenant)
    deleted, _ = FlowPause.objects.filter(queue=queue, job_name=job, schema_name=tenant).delete()
    assert_pauses()
    return bool(deleted)


def forget_tenant(schema: str) -> int:
    """A deleted tenant's pauses (its own, and its jobs' in it) go; returns the rows deleted.
    Left, they would park its waiting messages for good (``resume`` refuses a tenant that no
    longer exists) and pause a new tenant given the same schema name. Redis follows once the
    deletion commits: the released messages then meet their runs' end (``TENANT_DELETION``:
    no row, a cancelled row, or no tenant), and none stays parked."""
    deleted, _ = FlowPause.objects.filter(schema_name=schema).delete()
    if deleted:
        transaction.on_commit(_release_after_deletion)
    return deleted


def _release_after_deletion() -> None:
    try:
        assert_pauses()
    except transport.RedisError as exc:
        # The tenant's deletion must not fail for Redis: the next maintenance round's
        # assert_pauses writes the sets from PostgreSQL, which no longer names the tenant.
        logger.warning(
            "pauses: a deleted tenant's pauses stay in Redis until the next maintenance round: %s",
            exc,
        )


def on_tenant_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    """``post_delete`` receiver for the tenant model (connected in ``apps.ready``)."""
    schema = getattr(instance, "schema_name", "")
    if schema and schema != project_settings.public_schema_name():
        forget_tenant(str(schema))


# The pause rows as the admin last read them (monotonic time, rows): paused_by_rule reads them at
# most once a second; assert_pauses (every pause and resume) refreshes them.
_cache: tuple[float, list[tuple[str, str, str]]] = (0.0, [])


def assert_pauses() -> int:
    """Write every pause into each Redis dataset the queues use, and release what is no
    longer paused there; returns the parked buckets and held messages released."""
    global _cache
    rows = list(FlowPause.objects.values_list("queue", "job_name", "schema_name"))
    # This process's admin shows what it just paused or resumed, not a second-old copy.
    _cache = (time.monotonic(), rows)
    queues = [q for q, _, _ in rows if q]
    tenants = [transport.bucket_of(t) for q, j, t in rows if t and not j]
    jobs = [j for q, j, t in rows if j and not t]
    job_tenants = [(j, transport.bucket_of(t)) for q, j, t in rows if j and t]
    seen: set[tuple[Any, ...]] = set()
    released = 0
    for name in project_settings.rq_queue_names():
        redis = transport.connection_for(name)
        where = transport.redis_identity(redis)
        if where in seen:
            continue
        seen.add(where)
        released += transport.assert_pauses(
            redis, queues, tenants, jobs, job_tenants, conf.get().FAIRNESS
        )
    if released:
        logger.info("pauses: released %d parked tenant(s) and held message(s)", released)
    return released


def paused_by_rule(run: JobRun) -> str:
    """What holds a waiting run back ("tenant acme", "job billing.sync", "queue default",
    "billing.sync in acme"), or "" (the admin's status column; rows read at most once a
    second per process, so a list page costs one query)."""
    global _cache
    if run.status not in (RunStatus.QUEUED, RunStatus.DEFERRED):
        return ""
    read_at, rows = _cache
    if time.monotonic() - read_at > 1.0:
        rows = list(FlowPause.objects.values_list("queue", "job_name", "schema_name"))
        _cache = (time.monotonic(), rows)
    # A system run a tenant's run started is paused with that tenant (its messages wait in the
    # tenant's bucket: Envelope.flow_tenant).
    counts_against = run.schema_name or run.flow_schema
    for queue, job, tenant in rows:
        if queue and queue == run.queue:
            return gettext("queue %(queue)s") % {"queue": queue}
        if job and tenant and job == run.job_name and tenant == counts_against:
            return gettext("%(job)s in %(tenant)s") % {"job": job, "tenant": tenant}
        if job and not tenant and job == run.job_name:
            return gettext("job %(job)s") % {"job": job}
        if tenant and not job and tenant == counts_against:
            return gettext("tenant %(tenant)s") % {"tenant": tenant}
    return ""
