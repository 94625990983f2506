"""``manage.py kumiko_jobs list | enqueue | runs | retry | cancel | schedule | sweep | relay |
roles | pause | resume``.

Every subcommand is documented in docs/reference.md (Management commands).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from ...core import conf
from ...core.exceptions import KumikoJobsError
from ...definition.registry import registry
from ...enqueueing.schedules import sync_schedules
from ...enqueueing.submit import enqueue
from ...guard import role_sync
from ...models import JobRun, RunStatus
from ...operations import CANCELLED, cancel_run, retry_run
from ...worker import pauses
from ...worker.relay import relay_pending
from ...worker.sweep import sweep

_SINCE = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def _as_cli_text(message: str) -> str:
    """The library's errors name the Python keyword (``tenant=``); here it is a flag."""
    message = message.replace("tenant=<Tenant or schema name>", "--tenant <schema name>")
    return message.replace("without tenant=", "without --tenant").replace(
        "takes no tenant=", "takes no --tenant"
    )


def _since(value: str) -> timedelta:
    match = _SINCE.match(value.strip())
    if not match:
        raise CommandError(
            f"--since {value!r}: give a number and a unit, s, m, h or d (e.g. 30m, 2h, 7d)."
        )
    return timedelta(**{_UNITS[match[2]]: int(match[1])})


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
        run = sub.add_parser("enqueue", help="enqueue a job by name")
        run.add_argument("job")
        run.add_argument("--tenant", help="schema name (omit for system jobs)")
        run.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments")
        runs = sub.add_parser("runs", help="recent runs, newest first, with filters")
        runs.add_argument("--job", help="job name, e.g. billing.sync_invoice")
        runs.add_argument("--tenant", help="schema name; '-' for system runs (no tenant)")
        runs.add_argument("--status", action="append", choices=RunStatus.values, help="repeatable")
        runs.add_argument("--since", help="queued within this long: 30m, 2h, 7d")
        runs.add_argument("--limit", type=int, default=20, help="rows (default 20)")
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
        elif action == "relay":
            self._relay(options["loop"], options["interval"], options["grace"])
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
            except ValueError as exc:
                raise CommandError(f"--kwargs is not JSON: {exc}") from None
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
        if options["limit"] < 1:
            raise CommandError("--limit must be at least 1.")
        runs = JobRun.objects.order_by("-queued_at")
        if options["job"]:
            runs = runs.filter(job_name=options["job"])
        if options["tenant"]:
            runs = runs.filter(schema_name="" if options["tenant"] == "-" else options["tenant"])
        if options["status"]:
            runs = runs.filter(status__in=options["status"])
        if options["since"]:
            runs = runs.filter(queued_at__gte=timezone.now() - _since(options["since"]))
        rows = [("run id", "job", "tenant", "status", "attempts", "queued at", "error")]
        for run in runs[: options["limit"]]:
            error = f"{run.error_type}: {run.error_message}".strip(": ").replace("\n", " ")
            rows.append(
                (
                    str(run.run_id),
                    run.job_name,
                    run.schema_name or "-",
                    run.status,
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
