"""What the subcommands share: their description, the output table, the checks of the text and
numbers typed on the command line, and the name an operator acts under."""

from __future__ import annotations

import getpass
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...core.text import text_problem
from ...models import JobRun

# `relay --interval` / `--grace`, in seconds: a year (a sleep or a timedelta past that is a typo,
# and past ~1e11 seconds Python's sleep and datetime overflow).
MAX_SECONDS = 365 * 24 * 3600
# Options given without a flag (their usage line names them as such).
POSITIONAL = frozenset({"job", "run_id"})


def no_arguments(parser: CommandParser) -> None:
    """A subcommand without options."""


@dataclass(frozen=True)
class Subcommand:
    """One ``manage.py kumiko_jobs <name>``: its help line, the options it adds to its parser,
    and what it does with the parsed options (writing to the command's stdout and stderr)."""

    name: str
    help: str
    run: Callable[[BaseCommand, dict[str, Any]], None]
    arguments: Callable[[CommandParser], None] = no_arguments


def as_cli_text(message: str) -> str:
    """The library's errors name the Python keyword (``tenant=``); here it is a flag."""
    message = message.replace("tenant=<Tenant or schema name>", "--tenant <schema name>")
    return message.replace("without tenant=", "without --tenant").replace(
        "takes no tenant=", "takes no --tenant"
    )


def check_text(options: dict[str, Any]) -> None:
    """Refuse an argument PostgreSQL could not store (a NUL, or bytes that are not UTF-8, which
    Python hands over as lone surrogates) with the enqueue's own words, before it reaches a
    query and a traceback."""
    for key, value in options.items():
        for text in value if isinstance(value, list) else [value]:
            problem = text_problem(text) if isinstance(text, str) else ""
            if problem:
                name = key if key in POSITIONAL else f"--{key.replace('_', '-')}"
                raise CommandError(f"{name} {problem}; type it again as plain text.")


def seconds(flag: str, value: float | None, *, positive: bool) -> float | None:
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


def run_of(run_id: str) -> JobRun:
    """The run a ``run_id`` argument names, or the error that says why there is none."""
    try:
        pk = uuid.UUID(run_id.strip())
    except ValueError:
        raise CommandError(f"{run_id!r} is not a run id (a UUID).") from None
    run = JobRun.objects.filter(pk=pk).first()
    if run is None:
        raise CommandError(f"No run {pk}.")
    return run


def operator() -> str:
    """Who acts, as the run's history records it: ``manage.py (<login name>)``."""
    try:
        return f"manage.py ({getpass.getuser()})"
    except Exception:  # no user name in this environment
        return "manage.py"


def write_table(command: BaseCommand, rows: Sequence[Sequence[str]]) -> None:
    """Rows as columns padded to their widest cell, the first row the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        line = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
        command.stdout.write(line.rstrip())
