"""Jobs and runs from the command line: ``list``, ``enqueue``, ``runs``, ``retry``, ``cancel``."""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from ...core.exceptions import KumikoJobsError
from ...definition.registry import registry
from ...enqueueing.handle import resolve
from ...enqueueing.submit import submit
from ...enqueueing.validate import MAX_INTEGER_DIGITS
from ...history.columns import TRIGGER_LIMIT
from ...models import JobRun, RunStatus
from ...operations import CANCELLED, cancel_run, retry_run
from ...worker.holds import HoldKind, hold_of
from .common import Subcommand, as_cli_text, operator, run_of, write_table

# Nine digits: a count Python reads without its 4,300-digit limit, far past any history.
_SINCE = re.compile(r"^(\d{1,9})([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
# `runs --limit`: rows a terminal can take; PostgreSQL's LIMIT would overflow past 2**63.
MAX_LIMIT = 10_000


def _kind(d: Any) -> str:
    """What an enqueue without ``--tenant`` makes: a system run, a fan-out, or nothing."""
    return "system" if d.system else "per-tenant" if d.per_tenant else "tenant"


def _list(command: BaseCommand, options: dict[str, Any]) -> None:
    rows = [("job", "queue", "retries", "kind", "cron", "grants")]
    for d in registry:
        rows.append(
            (
                d.name,
                d.queue_name,
                str(d.retries if d.retries is not None else "-"),
                _kind(d),
                f"{d.cron} ({d.timezone})" if d.cron else "-",
                ",".join(d.grants) or "-",
            )
        )
    write_table(command, rows)


def _enqueue_arguments(parser: CommandParser) -> None:
    parser.add_argument("job", help="a registered job's name (kumiko_jobs list)")
    parser.add_argument(
        "--tenant",
        help="schema name; omit it for a system job, and for a per-tenant job to fan it out "
        "to every tenant",
    )
    parser.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments")


def _enqueue(command: BaseCommand, options: dict[str, Any]) -> None:
    kwargs = _json_kwargs(options["kwargs"])
    try:
        # An operator's run by hand, as the "Run a job" page's: a tenant's members may not
        # cancel or retry it (admin/tenant_acts.py).
        trigger = f"manual by {operator()}"[:TRIGGER_LIMIT]
        handle = submit(
            resolve(options["job"]), options["tenant"], kwargs, delay=0.0, trigger=trigger
        )
    except KumikoJobsError as exc:
        raise CommandError(as_cli_text(str(exc))) from None
    whom = handle.schema_name
    if whom is None:
        fans_out = registry.get(handle.job_name).per_tenant
        whom = "every tenant (a fan-out)" if fans_out else "system"
    command.stdout.write(f"queued run {uuid.UUID(handle.run_id)} of {handle.job_name} for {whom}")


def _json_kwargs(text: str) -> dict[str, Any]:
    """``--kwargs``: a JSON object, or the error that says what to pass instead."""
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(f"--kwargs is not JSON: {exc}") from None
    except ValueError:
        # Python refuses to read an integer of more than 4,300 digits.
        raise CommandError(
            f"--kwargs has a number of more than {MAX_INTEGER_DIGITS} digits; pass it as a string."
        ) from None
    except RecursionError:
        # json.loads recurses per nesting level: the enqueue's MAX_ARGUMENT_DEPTH
        # would refuse far less deep arguments anyway.
        raise CommandError(
            "--kwargs is nested too deeply to read; pass ids, not deep structures."
        ) from None
    if not isinstance(kwargs, dict):
        raise CommandError("--kwargs must be a JSON object")
    return kwargs


def _runs_arguments(parser: CommandParser) -> None:
    parser.add_argument("--job", help="job name, e.g. billing.sync_invoice")
    parser.add_argument("--tenant", help="schema name; '-' for system runs (no tenant)")
    parser.add_argument("--status", action="append", choices=RunStatus.values, help="repeatable")
    parser.add_argument("--since", help="queued within this long: 30m, 2h, 7d")
    parser.add_argument(
        "--limit", type=int, default=20, help=f"rows (default 20, at most {MAX_LIMIT})"
    )


def _runs(command: BaseCommand, options: dict[str, Any]) -> None:
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
        command.stdout.write("no runs match")
        return
    write_table(command, rows)


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


def _run_id_argument(parser: CommandParser) -> None:
    parser.add_argument("run_id", help="the failed or cancelled run's id (with or without dashes)")


def _retry(command: BaseCommand, options: dict[str, Any]) -> None:
    run = run_of(options["run_id"])
    try:
        handle = retry_run(run, by=operator())
    except KumikoJobsError as exc:
        raise CommandError(str(exc)) from None
    command.stdout.write(f"run {run.run_id} retried as run {uuid.UUID(handle.run_id)}")


def _cancel_arguments(parser: CommandParser) -> None:
    parser.add_argument("run_id", help="the run's id (with or without dashes)")


def _cancel(command: BaseCommand, options: dict[str, Any]) -> None:
    run_id = options["run_id"]
    try:
        run = JobRun.objects.get(pk=uuid.UUID(run_id.strip()))
    except (ValueError, JobRun.DoesNotExist):
        raise CommandError(f"no run {run_id!r}") from None
    result = cancel_run(run, by=operator())
    if not result:
        raise CommandError(f"run {run.run_id} has already finished ({run.status})")
    if result == CANCELLED:
        command.stdout.write(f"cancelled run {run.run_id} (it had not started)")
    else:
        command.stdout.write(
            f"asked running run {run.run_id} to stop; it ends cancelled when the job "
            "checks ctx.cancel_requested (a forking worker stops it after CANCEL_GRACE)"
        )


LIST = Subcommand("list", "registered jobs and their options", _list)
ENQUEUE = Subcommand("enqueue", "enqueue a job by name", _enqueue, _enqueue_arguments)
RUNS = Subcommand("runs", "recent runs, newest first, with filters", _runs, _runs_arguments)
RETRY = Subcommand(
    "retry", "start a new run of a failed or cancelled run", _retry, _run_id_argument
)
CANCEL = Subcommand(
    "cancel",
    "cancel a waiting run, or ask a running one to stop (ctx.cancel_requested)",
    _cancel,
    _cancel_arguments,
)
