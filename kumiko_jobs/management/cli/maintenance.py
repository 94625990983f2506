"""What keeps runs moving and history bounded: ``sweep``, ``schedule`` (cron entries), ``relay``
(the outbox: docs/reliability.md)."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from ...core import conf
from ...enqueueing.schedules import sync_schedules
from ...worker.relay import relay_pending
from ...worker.sweep import sweep
from .common import Subcommand, seconds


def _sweep(command: BaseCommand, options: dict[str, Any]) -> None:
    result = sweep()
    command.stdout.write(
        f"retried {result.retried} abandoned run(s), failed {result.abandoned}, "
        f"deleted {result.deleted_runs} expired run row(s), "
        f"{result.deleted_rejections} rejected message(s), "
        f"{result.deleted_failures} failure(s) and {result.deleted_audit} audit row(s)"
    )


def _schedule(command: BaseCommand, options: dict[str, Any]) -> None:
    synced = sync_schedules()
    for label, ids in (
        ("created", synced.created),
        ("updated", synced.updated),
        ("removed", synced.removed),
        ("unchanged", synced.unchanged),
    ):
        command.stdout.write(f"{label}: {', '.join(ids) or '-'}")


def _relay_arguments(parser: CommandParser) -> None:
    parser.add_argument("--loop", action="store_true", help="repeat until interrupted")
    parser.add_argument(
        "--interval", type=float, default=None, help="seconds between rounds (with --loop)"
    )
    parser.add_argument(
        "--grace", type=float, default=None, help="seconds a run must be due (RELAY_GRACE)"
    )


def _relay(command: BaseCommand, options: dict[str, Any]) -> None:
    # Checked before the first round: a bad --interval used to end the loop after it.
    loop = options["loop"]
    interval = seconds("--interval", options["interval"], positive=True)
    grace = seconds("--grace", options["grace"], positive=False)
    pause = interval if interval is not None else conf.get().MAINTENANCE_INTERVAL or 10
    while True:
        try:
            result = relay_pending(grace=grace)
        except Exception as exc:
            if not loop:
                raise CommandError(f"relay failed: {exc}") from exc
            # An outage: try again next round, on fresh connections.
            command.stderr.write(f"relay failed: {exc!r}")
            connections.close_all()
        else:
            command.stdout.write(
                f"checked {result.checked} waiting run(s), pushed {result.pushed}, "
                f"failed {result.failed} of unknown jobs"
            )
        if not loop:
            return
        time.sleep(pause)


SWEEP = Subcommand("sweep", "fail or retry abandoned runs, delete expired history", _sweep)
SCHEDULE = Subcommand("schedule", "register cron jobs with rq-scheduler (idempotent)", _schedule)
RELAY = Subcommand(
    "relay",
    "push the messages of committed runs that Redis does not hold",
    _relay,
    _relay_arguments,
)
