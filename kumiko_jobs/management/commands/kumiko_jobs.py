"""``manage.py kumiko_jobs list | enqueue | runs | retry | cancel | schedule | sweep | relay |
roles | drop-roles | pause | resume``.

Every subcommand is documented in docs/reference.md (Management commands) and lives in
``management/cli/`` (a module of this folder would be a command of its own); this module lists
them in the order ``--help`` shows them and dispatches.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ..cli import flow, jobs, maintenance, roles
from ..cli.common import Subcommand, check_text

SUBCOMMANDS: tuple[Subcommand, ...] = (
    jobs.LIST,
    maintenance.SWEEP,
    maintenance.SCHEDULE,
    maintenance.RELAY,
    jobs.CANCEL,
    roles.ROLES,
    roles.DROP_ROLES,
    jobs.ENQUEUE,
    jobs.RUNS,
    jobs.RETRY,
    flow.PAUSE,
    flow.RESUME,
)
_BY_NAME = {subcommand.name: subcommand for subcommand in SUBCOMMANDS}


class Command(BaseCommand):
    """``manage.py kumiko_jobs``: list jobs, enqueue, inspect, retry and cancel runs, run the sweep
    and the relay, and sync cron schedules and tenant roles from the command line.
    """

    help = "Inspect kumiko jobs and keep run history healthy."

    def add_arguments(self, parser: CommandParser) -> None:
        """One subcommand per action (``SUBCOMMANDS``), each with its own options."""
        sub = parser.add_subparsers(dest="action", required=True)
        for subcommand in SUBCOMMANDS:
            # The help line shows in `kumiko_jobs --help`; the description in `<name> --help`.
            parser_of = sub.add_parser(
                subcommand.name, help=subcommand.help, description=subcommand.help
            )
            subcommand.arguments(parser_of)

    def handle(self, *args: Any, **options: Any) -> None:
        """Run the chosen subcommand and print what it did."""
        check_text(options)
        _BY_NAME[options["action"]].run(self, options)
