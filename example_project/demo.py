"""The kumiko_jobs demo: tenants, a mix of jobs, a real RQ worker, and a table of what happened.

Run it with ``scripts/demo`` (or ``python -m example_project.demo``). It uses the PostgreSQL and
Redis of ``DATABASE_URL`` / ``REDIS_URL`` and starts embedded ones when nothing answers there.
Unless ``REDIS_URL`` is set, the demo keeps its queues in Redis database 1, apart from the
tests (9-15) and the benchmark (2), because it empties its queues on every start.

Options: ``--tenants N`` (default 3), ``--keep`` (keep the runs of earlier demos).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlsplit

from example_project.devservices import DEFAULT_DATABASE_URL, DEFAULT_REDIS_URL, ensure_services

if TYPE_CHECKING:
    from example_project.customers.models import Client

DEMO_REDIS_DB = 1
TENANT_NAMES = ("acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka")
# (number suffix, amount): the negative one is what validate_invoice rejects for good.
INVOICES = (("001", "120.00"), ("002", "75.50"), ("003", "310.00"), ("004", "-20.00"))
REQUEST_ID = "req-acme-0001"
# A retry chain with exponential back-off waits 1 + 2 + 4 s; anything far beyond that is a bug,
# and a demo that hangs silently is worse than one that says so.
DRAIN_TIMEOUT = 120.0


# --------------------------------------------------------------------------- terminal output


class Style:
    """ANSI styling only for a terminal that asked for none of NO_COLOR / TERM=dumb."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.color = self.tty and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"

    def _wrap(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def green(self, text: str) -> str:
        return self._wrap("32", text)

    def red(self, text: str) -> str:
        return self._wrap("31", text)

    def yellow(self, text: str) -> str:
        return self._wrap("33", text)

    def status(self, status: str, text: str) -> str:
        if status == "succeeded":
            return self.green(text)
        if status == "failed":
            return self.red(text)
        return self.yellow(text)


out = Style(sys.stdout)


def say(text: str = "") -> None:
    print(text, flush=True)


def step(number: int, total: int, text: str) -> None:
    say(f"{out.bold(f'[{number}/{total}]')} {text}")


class Progress:
    """One line that updates in place on a terminal, and prints sparingly otherwise."""

    def __init__(self) -> None:
        self._last = ""
        self._shown = False

    def update(self, text: str) -> None:
        if out.tty:
            sys.stdout.write("\r\033[K      " + out.dim(text))
            sys.stdout.flush()
            self._shown = True
        elif text != self._last:
            # In a log, one line per change of what we wait for, not per tick.
            say("      " + text)
        self._last = text

    def done(self) -> None:
        if self._shown:
            sys.stdout.write("\r\033[K")
            sys.stdout.flush()
            self._shown = False


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.1f} s"


# --------------------------------------------------------------------------- services, Django


def prepare_environment() -> bool:
    """Point at (or start) the services, then load Django. True when a server is embedded."""
    if not os.environ.get("REDIS_URL"):
        # The demo empties its queues on every start; its own database keeps that harmless.
        base = DEFAULT_REDIS_URL.rsplit("/", 1)[0]
        os.environ["REDIS_URL"] = f"{base}/{DEMO_REDIS_DB}"
    os.environ["DATABASE_URL"] = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    # Job log lines, failure lines and RQ's chatter would interleave with the progress and
    # say again what the table shows; ask for them with KUMIKO_LOG=INFO RQ_LOG=INFO.
    os.environ.setdefault("KUMIKO_LOG", "CRITICAL")
    os.environ.setdefault("RQ_LOG", "ERROR")
    wanted = (os.environ["DATABASE_URL"], os.environ["REDIS_URL"])
    # Services first: settings read DATABASE_URL / REDIS_URL once, at import.
    ensure_services(verbose=True)
    # Forced, not defaulted: a DJANGO_SETTINGS_MODULE inherited from a test run would point
    # the demo at the test settings.
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    import django

    django.setup()
    # ensure_services rewrites a URL only when it starts an embedded server in its place.
    return wanted != (os.environ["DATABASE_URL"], os.environ["REDIS_URL"])


# --------------------------------------------------------------------------- tenants and data


def tenant_names(count: int) -> list[str]:
    names = list(TENANT_NAMES[:count])
    names += [f"tenant{i}" for i in range(len(names) + 1, count + 1)]
    return names


def migrate_and_create_tenants(names: Sequence[str]) -> tuple[list[Client], list[str]]:
    """Shared migrations, the public tenant, and one schema per demo tenant (idempotent).

    Returns the tenants and the names of those created in this run.
    """
    from django.core.management import call_command
    from django.db import connection

    from example_project.customers.models import Client, Domain

    call_command("migrate_schemas", shared=True, interactive=False, verbosity=0)
    connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants adds it
    public, _ = Client.objects.get_or_create(schema_name="public", defaults={"name": "Operator"})
    Domain.objects.get_or_create(
        domain="localhost", defaults={"tenant": public, "is_primary": True}
    )
    tenants, created, existing = [], [], []
    for name in names:
        tenant = Client.objects.filter(schema_name=name).first()
        if tenant is None:
            tenant = Client(schema_name=name, name=name.capitalize())
            tenant.save(verbosity=0)  # creates the schema and runs the tenant migrations
            created.append(name)
        else:
            existing.append(name)
        Domain.objects.get_or_create(
            domain=f"{name}.localhost", defaults={"tenant": tenant, "is_primary": True}
        )
        tenants.append(tenant)
    if existing:
        # Schemas made by an older checkout may lack newer tenant migrations.
        for name in existing:
            call_command("migrate_schemas", schema_name=name, interactive=False, verbosity=0)
        connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants adds it
    return tenants, created


def prepare_tenant_data(tenants: Iterable[Client], *, reset: bool) -> dict[str, dict[str, int]]:
    """Invoices (and a demo user) per tenant. Returns {schema: {invoice number suffix: pk}}."""
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django_tenants.utils import tenant_context

    from example_project.billing.models import ActivityLog, Invoice

    invoices: dict[str, dict[str, int]] = {}
    for tenant in tenants:
        with tenant_context(tenant):
            if reset:
                ActivityLog.objects.all().delete()
            ids = {}
            for suffix, amount in INVOICES:
                invoice, _ = Invoice.objects.update_or_create(
                    number=f"{tenant.schema_name.upper()[:8]}-{suffix}",
                    defaults={"amount": Decimal(amount)},
                )
                if reset:
                    Invoice.objects.filter(pk=invoice.pk).update(synced_at=None, sync_attempts=0)
                ids[suffix] = invoice.pk
            invoices[tenant.schema_name] = ids
            user_model = get_user_model()
            if not user_model.objects.filter(username="alice").exists():
                user = user_model(username="alice", email="alice@example.com")
                user.set_unusable_password()
                user.save()
    return invoices


def clean_slate(queues: Sequence[str]) -> tuple[int, int]:
    """Forget earlier demo runs: kumiko's history tables and the demo queues' Redis keys.

    Only RQ's keys for the demo's own queues are removed (and the scheduled messages bound for
    them), so a Redis database shared with something else keeps that something else.
    Returns (history rows deleted, Redis messages deleted).
    """
    from django.apps import apps
    from django.db import connection

    from kumiko_jobs import transport

    models = list(apps.get_app_config("kumiko_jobs").get_models())
    rows = sum(model._default_manager.count() for model in models)
    tables = ", ".join(connection.ops.quote_name(m._meta.db_table) for m in models)
    with connection.cursor() as cursor:
        # One statement for all of them: foreign keys between them need no ordering then.
        cursor.execute(f"TRUNCATE {tables}")

    messages = 0
    for name in queues:
        queue = transport.get_queue(name)
        registries = (
            queue.started_job_registry,
            queue.finished_job_registry,
            queue.failed_job_registry,
            queue.deferred_job_registry,
            queue.scheduled_job_registry,
            queue.canceled_job_registry,
        )
        for registry in registries:
            for job_id in registry.get_job_ids():
                registry.remove(job_id, delete_job=True)
                messages += 1
        messages += queue.count
        queue.empty()
        scheduler = transport.scheduler_for(name)
        for job in scheduler.get_jobs():
            if job.origin == name:
                scheduler.cancel(job)
                job.delete()
                messages += 1
    return rows, messages


# --------------------------------------------------------------------------- the scenario


@dataclass(frozen=True, slots=True)
class Planned:
    """One enqueue of the scenario, and why it is in the demo."""

    job: str
    tenant: int  # index into the tenant list (wraps around)
    invoice: str | None = None
    kwargs: tuple[tuple[str, Any], ...] = ()


SCENARIO = (
    Planned("sync_invoice", 0, "001"),  # succeeds at once
    Planned("sync_invoice", 0, "002", (("fail_times", 1),)),  # fails once, retried, succeeds
    Planned("sync_invoice", 1, "001", (("fail_times", 99),)),  # fails all 4 attempts
    Planned("validate_invoice", 1, "002"),  # succeeds
    Planned("validate_invoice", 2, "004"),  # negative amount: Unrecoverable, no retry
    Planned("approve_invoice", 2, "003"),  # succeeds and enqueues a follow-up sync
)


def enqueue_scenario(
    tenants: Sequence[Client], invoices: dict[str, dict[str, int]]
) -> tuple[int, str]:
    """Enqueue the scenario. Returns (runs enqueued, the request's correlation id)."""
    from example_project.billing import jobs

    count = 0
    for planned in SCENARIO:
        tenant = tenants[planned.tenant % len(tenants)]
        kwargs = dict(planned.kwargs)
        if planned.invoice is not None:
            kwargs["invoice_id"] = invoices[tenant.schema_name][planned.invoice]
        getattr(jobs, planned.job).enqueue(tenant=tenant, **kwargs)
        count += 1
    for tenant in tenants:
        jobs.record_activity.enqueue(tenant=tenant, message="demo started")
        count += 1
    correlation = request_enqueue(tenants[0], invoices[tenants[0].schema_name]["003"])
    return count + 1, correlation


def request_enqueue(tenant: Client, invoice_id: int) -> str:
    """Enqueue the way a web request does: POST to the tenant's domain as a logged-in user.

    The run gets the request's X-Request-ID as its correlation id and the user as triggered_by.
    """
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client as HttpClient
    from django_tenants.utils import tenant_context

    browser = HttpClient()
    with tenant_context(tenant):
        # Sessions and users live in the tenant's schema, so the login must be made there.
        browser.force_login(get_user_model().objects.get(username="alice"))
    response = browser.post(
        f"/invoices/{invoice_id}/sync/",
        HTTP_HOST=f"{tenant.schema_name}.localhost",
        headers={"X-Request-ID": REQUEST_ID},
    )
    # The tenant middleware leaves the connection on the tenant's schema after the request.
    connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants adds it
    if response.status_code != 200:
        raise RuntimeError(f"the demo request failed: {response.status_code} {response.content!r}")
    return str(response["X-Request-ID"])


# --------------------------------------------------------------------------- the worker


def drain(queues: Sequence[str]) -> tuple[int, float, float]:
    """Run a real burst worker until nothing is queued or scheduled; act as rqscheduler between.

    Returns (bursts, seconds in the worker, seconds waiting for back-off).
    """
    from django.utils import timezone

    from kumiko_jobs import transport
    from kumiko_jobs.models import JobRun, RunStatus
    from kumiko_jobs.worker import Worker

    rq_queues = [transport.get_queue(name) for name in queues]
    connection = rq_queues[0].connection
    progress = Progress()
    bursts, working, waiting = 0, 0.0, 0.0
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while True:
        t = time.monotonic()
        Worker(rq_queues, connection=connection).work(burst=True, logging_level="WARNING")
        working += time.monotonic() - t
        bursts += 1
        t = time.monotonic()
        try:
            while True:
                # What `manage.py rqscheduler --interval 1` does, at a finer grain.
                if sum(transport.move_due_scheduled_jobs(name) for name in queues):
                    break
                if not any(transport.scheduled_job_ids(name) for name in queues):
                    return bursts, working, waiting
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"scheduled messages still waiting after {DRAIN_TIMEOUT:.0f} s"
                    )
                scheduled = JobRun.objects.filter(
                    status__in=(RunStatus.QUEUED, RunStatus.DEFERRED),
                    scheduled_for__isnull=False,
                )
                first = scheduled.order_by("scheduled_for").first()
                if first is not None and first.scheduled_for is not None:
                    left = max(0.0, (first.scheduled_for - timezone.now()).total_seconds())
                    what = (
                        f"attempt {first.attempts + 1}/{first.max_attempts} of "
                        f"{first.job_name.rsplit('.', 1)[-1]} in {first.schema_name}"
                    )
                    # The countdown only on a terminal: in a log it would be one line per tick.
                    when = f", due in {left:3.1f} s" if out.tty else ""
                    progress.update(f"waiting for back-off: {what}{when}")
                time.sleep(0.1)
        finally:
            progress.done()
            waiting += time.monotonic() - t


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True, slots=True)
class Row:
    tenant: str
    job: str
    subject: str
    status: str
    tries: str
    duration: str
    wall: str
    note: str


@dataclass(slots=True)
class Report:
    rows: list[Row] = field(default_factory=list)
    app: str = ""  # the one app label all jobs share, shown in the title instead of each row
    succeeded: int = 0
    failed: int = 0
    unfinished: int = 0
    retried: int = 0


def usernames(schemas: Iterable[str], user_ids: set[str]) -> dict[tuple[str, str], str]:
    """{(schema, user id): username}: users live in their tenant's schema."""
    from django.contrib.auth import get_user_model
    from django_tenants.utils import schema_context

    found: dict[tuple[str, str], str] = {}
    if not user_ids:
        return found
    pks = [int(pk) for pk in user_ids if pk.isdigit()]
    for schema in schemas:
        with schema_context(schema):
            for pk, name in (
                get_user_model().objects.filter(pk__in=pks).values_list("pk", "username")
            ):
                found[(schema, str(pk))] = name
    return found


def build_report(request_correlation: str) -> Report:
    from kumiko_jobs.models import JobAttempt, JobFailure, JobRun, RunStatus

    runs = list(JobRun.objects.order_by("schema_name", "queued_at"))
    first_error: dict[Any, str] = {}
    for attempt in JobAttempt.objects.exclude(error_type="").order_by("started_at"):
        first_error.setdefault(attempt.run_id, attempt.error_type)
    visible = {(f.schema_name, f.run_id): f.message_key for f in JobFailure.objects.all()}
    job_names = {run.run_id: run.job_name for run in runs}
    apps = {name.split(".", 1)[0] for name in job_names.values()}
    report = Report(app=apps.pop() if len(apps) == 1 else "")
    users = usernames(
        {r.schema_name for r in runs if r.schema_name and r.triggered_by},
        {r.triggered_by for r in runs if r.triggered_by},
    )

    def short(name: str) -> str:
        return name.split(".", 1)[-1] if report.app else name

    for run in runs:
        if run.status == RunStatus.SUCCEEDED:
            report.succeeded += 1
        elif run.status == RunStatus.FAILED:
            report.failed += 1
        else:
            report.unfinished += 1
        report.retried += run.attempts > 1
        notes = []
        if run.status == RunStatus.FAILED:
            message_key = visible.get((run.schema_name, run.run_id))
            if message_key:
                notes.append(f"tenant sees {message_key}")
            notes.append(f"operators see {run.error_type or 'the error'}")
        elif run.attempts > 1 and run.run_id in first_error:
            notes.append(f"retried after {first_error[run.run_id]}")
        if run.parent_run_id is not None:
            notes.append(f"follow-up of {short(job_names.get(run.parent_run_id, '?'))}")
        if run.correlation_id == request_correlation:
            user = users.get((run.schema_name, run.triggered_by), run.triggered_by)
            notes.append(f"request {run.correlation_id}" + (f" by {user}" if user else ""))
        wall = None
        if run.finished_at is not None:
            wall = (run.finished_at - run.queued_at).total_seconds()
        report.rows.append(
            Row(
                tenant=run.schema_name or "(system)",
                job=short(run.job_name),
                subject=run.subject or "-",
                status=run.status,
                tries=f"{run.attempts}/{run.max_attempts}",
                # The admin's "duration": the run's, i.e. its last attempt's time in the job.
                duration=fmt_seconds(
                    run.duration_ms / 1000 if run.duration_ms is not None else None
                ),
                wall=fmt_seconds(wall),
                note="; ".join(notes),
            )
        )
    return report


HEADERS = Row("TENANT", "JOB", "SUBJECT", "STATUS", "TRIES", "DURATION", "WALL", "NOTE")
FIELDS = tuple(f.name for f in fields(Row))
RIGHT_ALIGNED = {"tries", "duration", "wall"}


def render_table(rows: Sequence[Row]) -> list[str]:
    """Aligned columns; the tenant is named once per group, groups apart by a blank line."""
    # Widths from the plain text: colour codes are added after padding.
    widths = {f: max(len(getattr(r, f)) for r in (HEADERS, *rows)) for f in FIELDS}

    def line(row: Row, *, header: bool, show_tenant: bool = True) -> str:
        cells = []
        for f in FIELDS:
            text = getattr(row, f) if (f != "tenant" or show_tenant) else ""
            if f == "note":  # last column: no padding, so no trailing blanks
                cells.append(out.dim(text) if text and not header else text)
                continue
            padded = text.rjust(widths[f]) if f in RIGHT_ALIGNED else text.ljust(widths[f])
            cells.append(out.status(text, padded) if f == "status" and not header else padded)
        joined = "  ".join(cells).rstrip()
        return out.bold(joined) if header else joined

    lines = [line(HEADERS, header=True)]
    previous: str | None = None
    for row in rows:
        if previous is not None and row.tenant != previous:
            lines.append("")
        lines.append(line(row, header=False, show_tenant=row.tenant != previous))
        previous = row.tenant
    return lines


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/demo",
        description="Multi-tenant jobs with kumiko_jobs: enqueue a mix, run a worker, show runs.",
    )
    parser.add_argument(
        "--tenants", type=int, default=3, metavar="N", help="number of tenants (default 3)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep earlier runs and queued messages (no clean-up)"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.tenants <= 50:
        parser.error("--tenants must be between 1 and 50")
    return args


DEMO_PASSWORD = "kumiko-demo"  # a demo database's logins only; printed at the end


def demo_logins(tenants: Sequence[Client]) -> list[tuple[str, str, str]]:
    """Admin logins for the demo (idempotent; the password is reset on every run).

    An operator (a superuser of the public schema, also granted ``view_all_tenants`` by name:
    the permission the operators' view of every tenant's runs takes) and a staff user who may
    view a tenant's runs and failures: of the first tenant with a failed run, so that its login
    has a failure to look at (the first tenant when none failed). Users live in each schema's
    own auth tables (auth is a tenant app too, so a tenant's users are its members). Returns
    (who, url, username).
    """
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django_tenants.utils import schema_context

    def ensure(schema: str, username: str, *, superuser: bool) -> None:
        with schema_context(schema):
            user_model = get_user_model()
            user = user_model.objects.filter(username=username).first() or user_model(
                username=username
            )
            user.is_staff = True
            user.is_superuser = superuser
            user.set_password(DEMO_PASSWORD)
            user.save()
            # The operator holds view_all_tenants by name as well, so that it stays an operator
            # if its superuser flag is taken away; a tenant's staff may only view.
            codenames = ("view_all_tenants",) if superuser else ("view_jobrun", "view_jobfailure")
            user.user_permissions.set(
                Permission.objects.filter(
                    content_type__app_label="kumiko_jobs", codename__in=codenames
                )
            )

    ensure("public", "operator", superuser=True)
    logins = [("operators", "http://localhost:8000/admin/", "operator")]
    if tenants:
        schema = _with_a_failed_run(tenants).schema_name
        ensure(schema, f"{schema}-staff", superuser=False)
        logins.append(
            (f"tenant {schema}", f"http://{schema}.localhost:8000/admin/", f"{schema}-staff")
        )
    return logins


def _with_a_failed_run(tenants: Sequence[Client]) -> Client:
    from kumiko_jobs.models import JobRun, RunStatus

    failed = set(
        JobRun.objects.filter(status=RunStatus.FAILED).values_list("schema_name", flat=True)
    )
    return next((t for t in tenants if t.schema_name in failed), tenants[0])


def manage_py() -> str:
    """``manage.py`` with the demo's own Python (its venv's, where Django is installed), as
    typed from the repository root, where scripts/demo runs."""
    relative = os.path.relpath(sys.executable)
    return f"{sys.executable if relative.startswith('..') else relative} manage.py"


def exports(embedded: bool) -> str:
    """``export ...`` of the URLs the demo used, where they differ from the settings' defaults
    (which manage.py would use otherwise); nothing with embedded servers, which stop with it."""
    if embedded:
        return ""
    changed = [
        f"{name}={os.environ[name]}"
        for name, default in (
            ("DATABASE_URL", DEFAULT_DATABASE_URL),
            ("REDIS_URL", DEFAULT_REDIS_URL),
        )
        if os.environ[name] != default
    ]
    return f"export {' '.join(changed)}" if changed else ""


def how_to_run_for_real(queues: Sequence[str], embedded: bool) -> str:
    """One copy-pasteable line that starts the real worker and scheduler on the demo's data."""
    manage = manage_py()
    commands = f"{manage} rqworker {' '.join(queues)} & {manage} rqscheduler --interval 1"
    if embedded:
        # The embedded servers stop when the demo exits: their URLs would lead nowhere.
        return f"Real processes (with PostgreSQL and Redis running): {commands}"
    return f"Real processes: {commands}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    say(out.bold("kumiko_jobs demo") + out.dim(" - multi-tenant background jobs on RQ"))
    embedded = prepare_environment()
    redis_url = os.environ["REDIS_URL"]

    from django.conf import settings

    queues = list(settings.RQ_QUEUES)
    total = 5

    t = time.monotonic()
    names = tenant_names(args.tenants)
    tenants, created = migrate_and_create_tenants(names)
    invoices = prepare_tenant_data(tenants, reset=not args.keep)
    made = f" ({len(created)} new)" if created else ""
    step(
        1,
        total,
        f"database {settings.DATABASES['default']['NAME']} migrated; "
        f"tenants {', '.join(names)}{made}, {len(INVOICES)} invoices each "
        + out.dim(fmt_seconds(time.monotonic() - t)),
    )

    if args.keep:
        step(2, total, "--keep: earlier runs and queued messages stay")
    else:
        rows_deleted, messages_deleted = clean_slate(queues)
        db = urlsplit(redis_url).path.lstrip("/") or "0"
        step(
            2,
            total,
            f"clean slate: removed {rows_deleted} history rows and {messages_deleted} queue "
            f"messages of earlier demos (queues {', '.join(queues)} in Redis db {db})",
        )

    t = time.monotonic()
    enqueued, correlation = enqueue_scenario(tenants, invoices)
    step(
        3,
        total,
        f"enqueued {enqueued} runs in {len(tenants)} tenants, one by a POST to "
        f"{tenants[0].schema_name}.localhost with X-Request-ID {correlation} "
        + out.dim(fmt_seconds(time.monotonic() - t)),
    )

    step(4, total, "burst worker kumiko_jobs.worker.Worker, moving due retries in between")
    bursts, working, waiting = drain(queues)
    say(
        f"      {bursts} bursts: {fmt_seconds(working)} running jobs, "
        f"{fmt_seconds(waiting)} waiting for retry back-off"
    )

    report = build_report(correlation)
    step(5, total, f"runs of {report.app} jobs, per tenant" if report.app else "runs, per tenant")
    say()
    for text in render_table(report.rows):
        say("  " + text if text else "")
    say()
    say(
        out.dim(
            "  TRIES attempts used/allowed   DURATION the admin's duration: the last attempt's "
            "time in the job   WALL queued to finished, back-off included"
        )
    )
    say()
    unfinished = f", {report.unfinished} unfinished" if report.unfinished else ""
    say(
        out.bold(
            f"{len(report.rows)} runs in {len({r.tenant for r in report.rows})} tenants: "
            f"{report.succeeded} succeeded, {report.failed} failed{unfinished} "
            f"({report.retried} retried); total {fmt_seconds(time.monotonic() - started)}"
        )
    )
    logins = demo_logins(tenants)
    say()
    say(out.bold("Next") + " (from the repository's root)")
    environment = exports(embedded)
    if environment:  # the lines below use the demo's database and Redis
        say(f"  Environment: {environment}")
    say(f"  {how_to_run_for_real(queues, embedded)}")
    # --insecure: serve the admin's CSS with DEBUG off (the example's default).
    say(f"  Admin: {manage_py()} runserver --insecure, then log in with")
    width = max(len(who) for who, _, _ in logins)
    url_width = max(len(url) for _, url, _ in logins)
    user_width = max(len(username) for _, _, username in logins)
    for who, url, username in logins:
        say(
            f"    {who.ljust(width)}  {url.ljust(url_width)}  "
            f"user {out.bold(username.ljust(user_width))}  password {out.bold(DEMO_PASSWORD)}"
        )
    say(f"    {'queues'.ljust(width)}  http://localhost:8000/django-rq/ (as operator)")
    if embedded:
        note = "    (with PostgreSQL and Redis running; the embedded ones stop with the demo)"
        say(out.dim(note))
    roles = demo_roles()
    if roles:
        # Roles are server-wide: dropping the demo's database leaves them behind.
        say(
            f"  Roles: DB_ROLES made {roles} PostgreSQL roles for this database, server-wide "
            f"(dropdb leaves them); remove them with: {manage_py()} kumiko_jobs drop-roles --yes"
        )
    return 0


def demo_roles() -> int:
    """How many roles kumiko holds on the server for the demo's database (DB_ROLES)."""
    from django.db import connection

    from kumiko_jobs.guard.roles import names as role_names

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_roles WHERE rolname LIKE %s", [role_names.prefix() + r"\_%"]
        )
        return int(cursor.fetchone()[0])


if __name__ == "__main__":
    sys.exit(main())
