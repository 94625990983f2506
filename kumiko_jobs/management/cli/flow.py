"""``pause`` and ``resume``: hold a queue, a job, a tenant, or a job in one tenant, cluster-wide
(``worker/pauses.py``), and let it run again."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...worker import pauses
from .common import Subcommand, operator


def _arguments(parser: CommandParser) -> None:
    parser.add_argument("--queue", default="", help="an RQ_QUEUES name")
    parser.add_argument("--job", default="", help="a job name, e.g. billing.sync_invoice")
    parser.add_argument("--tenant", default="", help="a tenant's schema name")


def _what(queue: str, job: str, tenant: str) -> str:
    return (
        f"queue {queue}"
        if queue
        else (f"{job} in {tenant}" if job and tenant else f"job {job}" if job else "")
        or f"tenant {tenant}"
    )


def _pause(command: BaseCommand, options: dict[str, Any]) -> None:
    queue, job, tenant = options["queue"], options["job"], options["tenant"]
    what = _what(queue, job, tenant)
    try:
        done = pauses.pause(queue, job, tenant, by=operator())
    except pauses.PauseRefused as exc:
        raise CommandError(str(exc)) from None
    command.stdout.write(f"paused {what}" if done else f"{what} was paused already")


def _resume(command: BaseCommand, options: dict[str, Any]) -> None:
    queue, job, tenant = options["queue"], options["job"], options["tenant"]
    what = _what(queue, job, tenant)
    try:
        done = pauses.resume(queue, job, tenant)
    except pauses.PauseRefused as exc:
        raise CommandError(str(exc)) from None
    command.stdout.write(f"resumed {what}" if done else f"{what} was not paused")


PAUSE = Subcommand(
    "pause",
    "hold a queue, a job, a tenant, or a job in one tenant (cluster-wide)",
    _pause,
    _arguments,
)
RESUME = Subcommand("resume", "let what a pause held run again, where it was", _resume, _arguments)
