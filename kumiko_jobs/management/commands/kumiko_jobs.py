"""``manage.py kumiko_jobs list | enqueue | runs | retry | cancel | schedule | sweep | relay |
roles | drop-roles | pause | resume``.

Every subcommand is documented in docs/reference.md (Management commands).
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from ...core import conf
from ...core.exceptions import KumikoJobsError
from ...core.text import text_problem
from ...definition.registry import registry
from ...enqueueing.schedules import sync_schedules
from ...enqueueing.submit import enqueue
from ...enqueueing.validate import MAX_INTEGER_DIGITS
from ...guard.roles import names as role_names
from ...guard.roles import privileges as role_grants
from ...guard.roles import sync as role_sync
from ...models import JobRun, RunStatus
from ...operations import CANCELLED, cancel_run, retry_run
from ...worker import pauses
from ...worker.holds import HoldKind, hold_of
from ...worker.relay import relay_pending
from ...worker.sweep import sweep

# Nine digits: a count Python reads without its 4,300-digit limit, far past any history.
_SINCE = re.compile(r"^(\d{1,9})([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
# `runs --limit`: rows a terminal can take; PostgreSQL's LIMIT would overflow past 2**63.
MAX_LIMIT = 10_000
# `relay --interval` / `--grace`, in seconds: a year (a sleep or a timedelta past that is a typo,
# and past ~1e11 seconds Python's sleep and datetime overflow).
MAX_SECONDS = 365 * 24 * 3600


def _as_cli_text(message: str) -> str:
    """The library's errors name the Python keyword (``tenant=``); here it is a flag."""
    message = message.replace("tenant=<Tenant or schema name>", "--tenant <schema name>")
    return message.replace("without tenant=", "without --tenant").replace(
        "takes no tenant=", "takes no --tenant"
    )


def _since(value: str) -> datetime:
    """The time ``--since`` goes back to: a number and a unit, no further back than year 1."""
    match = _SINCE.match(value.strip())
    if not match:
        raise CommandError(
            f"--since {value!r}: give a number (at most 9 digits) and a unit, s, m, h or d "
            "(e.g. 30m, 2h, 7d)."
        )
    try:
        return timezone.now() - timedelta(**{_UNITS[match[2]]: int(match[1])})
    except OverflowError:
        raise CommandError(
            f"--since {value!r} goes back before the year 1; give a shorter time (e.g. 3650d)."
        ) from None


def _seconds(flag: str, value: float | None, *, positive: bool) -> float | None:
    """A ``--interval`` or ``--grace`` value, checked before the first round: a finite number of
    seconds, above 0 (``positive``) or at least 0, at most ``MAX_SECONDS``."""
    if value is None:
        return None
    low_ok = value > 0 if positive else value >= 0
    if not (math.isfinite(value) and low_ok and value <= MAX_SECONDS):
        bound = "more than 0" if positive else "at least 0"
        raise CommandError(
            f"{flag} {value!r}: give a number of seconds, {bound} and at most {MAX_SECONDS}."
        )
    return value


def _check_text(options: dict[str, Any]) -> None:
    """Refuse an argument PostgreSQL could not store (a NUL, or bytes that are not UTF-8, which
    Python hands over as lone surrogates) with the enqueue's own words, before it reaches a
    query and a traceback."""
    for key, value in options.items():
        for text in value if isinstance(value, list) else [value]:
            problem = text_problem(text) if isinstance(text, str) else ""
            if problem:
                name = key if key in _POSITIONAL else f"--{key.replace('_', '-')}"
                raise CommandError(f"{name} {problem}; type it again as plain text.")


# Options given without a flag (their usage line names them as such).
_POSITIONAL = frozenset({"job", "run_id"})


def _run(run_id: str) -> JobRun:
    try:
        pk = uuid.UUID(run_id.strip())
    except ValueError:
        raise CommandError(f"{run_id!r} is not a run id (a UUID).") from None
    run = JobRun.objects.filter(pk=pk).first()
    if run is None:
        raise CommandError(f"No run {pk}.")
    return run


class Command(BaseCommand):
    """``manage.py kumiko_jobs``: list jobs, enqueue, inspect, retry and cancel runs, run the sweep
    and the relay, and sync cron schedules and tenant roles from the command line.
    """

    help = "Inspect kumiko jobs and keep run history healthy."

    def add_arguments(self, parser: CommandParser) -> None:
        """One subcommand per action (``list``, ``sweep``, ``schedule``, ``relay``, ``cancel``,
        ``roles``, ``enqueue``, ``runs``, ``retry``), each with its own options.
        """
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="registered jobs and their options")
        sub.add_parser("sweep", help="fail or retry abandoned runs, delete expired history")
        sub.add_parser("schedule", help="register cron jobs with rq-scheduler (idempotent)")
        relay = sub.add_parser(
            "relay", help="push the messages of committed runs that Redis does not hold"
        )
        relay.add_argument("--loop", action="store_true", help="repeat until interrupted")
        relay.add_argument(
            "--interval", type=float, default=None, help="seconds between rounds (with --loop)"
        )
        relay.add_argument(
            "--grace", type=float, default=None, help="seconds a run must be due (RELAY_GRACE)"
        )
        cancel = sub.add_parser(
            "cancel",
            help="cancel a waiting run, or ask a running one to stop (ctx.cancel_requested)",
        )
        cancel.add_argument("run_id", help="the run's id (with or without dashes)")
        roles = sub.add_parser(
            "roles",
            help="create or repair every tenant's database role and grants, drop roles of "
            "deleted tenants, give every role its current password (idempotent, DB_ROLES)",
        )
        roles.add_argument(
            "--check", action="store_true", help="only list tenants whose role is out of date"
        )
        _add_drop_roles(sub)
        run = sub.add_parser("enqueue", help="enqueue a job by name")
        run.add_argument("job")
        run.add_argument("--tenant", help="schema name (omit for system jobs)")
        run.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments")
        runs = sub.add_parser("runs", help="recent runs, newest first, with filters")
        runs.add_argument("--job", help="job name, e.g. billing.sync_invoice")
        runs.add_argument("--tenant", help="schema name; '-' for system runs (no tenant)")
        runs.add_argument("--status", action="append", choices=RunStatus.values, help="repeatable")
        runs.add_argument("--since", help="queued within this long: 30m, 2h, 7d")
        runs.add_argument(
            "--limit", type=int, default=20, help=f"rows (default 20, at most {MAX_LIMIT})"
        )
        retry = sub.add_parser("retry", help="start a new run of a failed or cancelled run")
        retry.add_argument("run_id")
        for verb, text in (
            ("pause", "hold a queue, a job, a tenant, or a job in one tenant (cluster-wide)"),
            ("resume", "let what a pause held run again, where it was"),
        ):
            flow = sub.add_parser(verb, help=text)
            flow.add_argument("--queue", default="", help="an RQ_QUEUES name")
            flow.add_argument("--job", default="", help="a job name, e.g. billing.sync_invoice")
            flow.add_argument("--tenant", default="", help="a tenant's schema name")

    def handle(self, *args: Any, **options: Any) -> None:
        """Run the chosen subcommand and print what it did."""
        action = options["action"]
        _check_text(options)
        if action == "list":
            self._list()
        elif action == "schedule":
            synced = sync_schedules()
            for label, ids in (
                ("created", synced.created),
                ("updated", synced.updated),
                ("removed", synced.removed),
                ("unchanged", synced.unchanged),
            ):
                self.stdout.write(f"{label}: {', '.join(ids) or '-'}")
        elif action == "roles":
            self._roles(options["check"])
        elif action == "drop-roles":
            _drop_roles(self, options["yes"], options["of_dropped_database"])
        elif action == "relay":
            # Checked before the first round: a bad --interval used to end the loop after it.
            self._relay(
                options["loop"],
                _seconds("--interval", options["interval"], positive=True),
                _seconds("--grace", options["grace"], positive=False),
            )
        elif action == "sweep":
            result = sweep()
            self.stdout.write(
                f"retried {result.retried} abandoned run(s), failed {result.abandoned}, "
                f"deleted {result.deleted_runs} expired run row(s), "
                f"{result.deleted_rejections} rejected message(s), "
                f"{result.deleted_failures} failure(s) and {result.deleted_audit} audit row(s)"
            )
        elif action == "cancel":
            self._cancel(options["run_id"])
        elif action == "enqueue":
            try:
                kwargs = json.loads(options["kwargs"])
            except json.JSONDecodeError as exc:
                raise CommandError(f"--kwargs is not JSON: {exc}") from None
            except ValueError:
                # Python refuses to read an integer of more than 4,300 digits.
                raise CommandError(
                    f"--kwargs has a number of more than {MAX_INTEGER_DIGITS} digits; pass it "
                    "as a string."
                ) from None
            except RecursionError:
                # json.loads recurses per nesting level: the enqueue's MAX_ARGUMENT_DEPTH
                # would refuse far less deep arguments anyway.
                raise CommandError(
                    "--kwargs is nested too deeply to read; pass ids, not deep structures."
                ) from None
            if not isinstance(kwargs, dict):
                raise CommandError("--kwargs must be a JSON object")
            try:
                handle = enqueue(options["job"], tenant=options["tenant"], **kwargs)
            except KumikoJobsError as exc:
                raise CommandError(_as_cli_text(str(exc))) from None
            self.stdout.write(
                f"queued run {uuid.UUID(handle.run_id)} of {handle.job_name} "
                f"for {handle.schema_name or 'system'}"
            )
        elif action == "runs":
            self._runs(options)
        elif action == "retry":
            self._retry(options["run_id"])
        elif action in ("pause", "resume"):
            self._flow(action, options["queue"], options["job"], options["tenant"])
        elif action == "cancel":
            self._cancel(options["run_id"])

    def _runs(self, options: dict[str, Any]) -> None:
        if not 1 <= options["limit"] <= MAX_LIMIT:
            raise CommandError(f"--limit must be between 1 and {MAX_LIMIT}.")
        runs = JobRun.objects.order_by("-queued_at")
        if options["job"]:
            runs = runs.filter(job_name=options["job"])
        if options["tenant"]:
            runs = runs.filter(schema_name="" if options["tenant"] == "-" else options["tenant"])
        if options["status"]:
            runs = runs.filter(status__in=options["status"])
        if options["since"]:
            runs = runs.filter(queued_at__gte=_since(options["since"]))
        rows = [("run id", "job", "tenant", "status", "attempts", "queued at", "error")]
        for run in runs[: options["limit"]]:
            error = f"{run.error_type}: {run.error_message}".strip(": ").replace("\n", " ")
            rows.append(
                (
                    str(run.run_id),
                    run.job_name,
                    run.schema_name or "-",
                    _status_of(run),
                    str(run.attempts),
                    timezone.localtime(run.queued_at).strftime("%Y-%m-%d %H:%M:%S"),
                    error[:60] or "-",
                )
            )
        if len(rows) == 1:
            self.stdout.write("no runs match")
            return
        self._table(rows)

    def _flow(self, action: str, queue: str, job: str, tenant: str) -> None:
        import getpass

        what = (
            f"queue {queue}"
            if queue
            else (f"{job} in {tenant}" if job and tenant else f"job {job}" if job else "")
            or f"tenant {tenant}"
        )
        try:
            if action == "pause":
                try:
                    who = f"manage.py ({getpass.getuser()})"
                except Exception:  # no user name in this environment
                    who = "manage.py"
                done = pauses.pause(queue, job, tenant, by=who)
                self.stdout.write(f"paused {what}" if done else f"{what} was paused already")
            else:
                done = pauses.resume(queue, job, tenant)
                self.stdout.write(f"resumed {what}" if done else f"{what} was not paused")
        except pauses.PauseRefused as exc:
            raise CommandError(str(exc)) from None

    def _retry(self, run_id: str) -> None:
        run = _run(run_id)
        try:
            handle = retry_run(run)
        except KumikoJobsError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"run {run.run_id} retried as run {uuid.UUID(handle.run_id)}")

    def _table(self, rows: Sequence[Sequence[str]]) -> None:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            line = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
            self.stdout.write(line.rstrip())

    def _roles(self, check_only: bool) -> None:
        if check_only:
            stale = role_sync.out_of_date()
            for name in stale:
                self.stdout.write(f"out of date: {name}")
            if stale:
                raise CommandError(f"{len(stale)} tenant role(s) out of date")
            self.stdout.write("every tenant role is up to date")
            return
        result = role_sync.sync_all()
        self.stdout.write(
            f"ensured {len(result.ensured)} tenant role(s), dropped {len(result.dropped)} "
            f"of deleted tenants ({', '.join(result.dropped) or '-'}); skipped tenants without "
            f"a schema: {', '.join(result.skipped) or '-'}"
        )

    def _relay(self, loop: bool, interval: float | None, grace: float | None) -> None:
        import time

        from django.db import connections

        pause = interval if interval is not None else conf.get().MAINTENANCE_INTERVAL or 10
        while True:
            try:
                result = relay_pending(grace=grace)
            except Exception as exc:
                if not loop:
                    raise CommandError(f"relay failed: {exc}") from exc
                # An outage: try again next round, on fresh connections.
                self.stderr.write(f"relay failed: {exc!r}")
                connections.close_all()
            else:
                self.stdout.write(
                    f"checked {result.checked} waiting run(s), pushed {result.pushed}, "
                    f"failed {result.failed} of unknown jobs"
                )
            if not loop:
                return
            time.sleep(pause)

    def _cancel(self, run_id: str) -> None:
        import getpass
        import uuid

        try:
            run = JobRun.objects.get(pk=uuid.UUID(run_id.strip()))
        except (ValueError, JobRun.DoesNotExist):
            raise CommandError(f"no run {run_id!r}") from None
        try:
            who = f"manage.py ({getpass.getuser()})"
        except Exception:  # no user name in this environment
            who = "manage.py"
        result = cancel_run(run, by=who)
        if not result:
            raise CommandError(f"run {run.run_id} has already finished ({run.status})")
        if result == CANCELLED:
            self.stdout.write(f"cancelled run {run.run_id} (it had not started)")
        else:
            self.stdout.write(
                f"asked running run {run.run_id} to stop; it ends cancelled when the job "
                "checks ctx.cancel_requested (a forking worker stops it after CANCEL_GRACE)"
            )

    def _list(self) -> None:
        rows = [("job", "queue", "retries", "kind", "grants")]
        for d in registry:
            kind = "system" if d.system else "tenant"
            rows.append(
                (
                    d.name,
                    d.queue_name,
                    str(d.retries if d.retries is not None else "-"),
                    kind,
                    ",".join(d.grants) or "-",
                )
            )
        self._table(rows)


# --- drop-roles: the roles DB_ROLES created for this database, removed ---------------------------


def _add_drop_roles(sub: Any) -> None:
    drop = sub.add_parser(
        "drop-roles",
        help="drop the database roles kumiko created for this database (DB_ROLES), or for one "
        "that was dropped; lists them unless --yes",
    )
    drop.add_argument("--yes", action="store_true", help="drop them (without it: only list)")
    drop.add_argument(
        "--of-dropped-database",
        metavar="NAME",
        help="the roles of a database that no longer exists (dropdb leaves its roles behind)",
    )


def _drop_roles(command: BaseCommand, yes: bool, dropped_database: str | None) -> None:
    """Roles are cluster-wide: ``dropdb`` leaves them behind. Only the roles of one database's
    prefix (``guard.roles.names``) are touched, never another database's or anyone else's."""
    from django.db import connections  # as _relay: the module's callers need none

    if dropped_database is None:
        with connections["default"].cursor() as cursor:
            roles = role_grants.our_roles(cursor)
            groups = [role_names.group_name(), role_names.writers_group_name()]
            roles += [g for g in groups if _role_exists(cursor, g)]
        where = f"database {connections['default'].settings_dict['NAME']!r}"
    else:
        with connections["default"]._nodb_cursor() as cursor:  # the server's maintenance db
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [dropped_database])
            if cursor.fetchone():
                raise CommandError(
                    f"database {dropped_database!r} exists: its roles hold grants there. Run "
                    "`manage.py kumiko_jobs drop-roles` with DATABASES pointing at it instead."
                )
            cursor.execute(
                "SELECT rolname FROM pg_roles WHERE rolname LIKE %s ORDER BY rolname",
                [role_names.prefix_of(dropped_database) + r"\_%"],
            )
            roles = [row[0] for row in cursor.fetchall()]
        where = f"dropped database {dropped_database!r}"
    if not roles:
        command.stdout.write(f"no kumiko roles of {where}")
        return
    if not yes:
        for role in roles:
            command.stdout.write(f"would drop: {role}")
        raise CommandError(
            f"{len(roles)} role(s) of {where} listed, none dropped: pass --yes to drop them "
            "(tenant runs under DB_ROLES then fail to log in until `kumiko_jobs roles`)."
        )
    if dropped_database is None:
        dropped = role_sync.drop_all()
        gone = [*dropped, *(r for r in roles if r not in dropped)]
    else:
        with connections["default"]._nodb_cursor() as cursor:
            gone = role_names.drop_roles_of_dropped_database(cursor, dropped_database)
    command.stdout.write(f"dropped {len(gone)} role(s) of {where}: {', '.join(sorted(gone))}")


def _role_exists(cursor: Any, role: str) -> bool:
    cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
    return cursor.fetchone() is not None


def _status_of(run: JobRun) -> str:
    """The run's status, and for a waiting run what holds it back (as the admin says it):
    ``queued, paused (tenant acme)``, ``queued, waiting for a rate limit until 12:00:03``,
    ``queued, due at 12:05:00``."""
    hold = hold_of(run)
    if hold is None:
        return str(run.status)
    at = f"{timezone.localtime(hold.at):%H:%M:%S}" if hold.at else ""
    if hold.kind == HoldKind.UNTIL:
        return f"{run.status}, due at {at}"
    return f"{run.status}, {hold.text}" + (f" until {at}" if at else "")
