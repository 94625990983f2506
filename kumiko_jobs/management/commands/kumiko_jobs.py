"""``manage.py kumiko_jobs list | schedule | sweep | relay | enqueue | roles``."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...enqueueing import enqueue, queue_of
from ...exceptions import KumikoJobsError
from ...registry import registry
from ...sweep import sweep


class Command(BaseCommand):
    help = "Inspect kumiko jobs and keep run history healthy."

    def add_arguments(self, parser: CommandParser) -> None:
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

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "list":
            self._list()
        elif action == "schedule":
            from ...schedules import sync_schedules

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
                f"deleted {result.deleted_runs} expired run row(s) and "
                f"{result.deleted_rejections} rejected message(s)"
            )
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
                raise CommandError(str(exc)) from None
            self.stdout.write(
                f"queued run {handle.run_id} of {handle.job_name} "
                f"for {handle.schema_name or 'system'}"
            )

    def _roles(self, check_only: bool) -> None:
        from ... import db_roles

        if check_only:
            stale = db_roles.out_of_date()
            for name in stale:
                self.stdout.write(f"out of date: {name}")
            if stale:
                raise CommandError(f"{len(stale)} tenant role(s) out of date")
            self.stdout.write("every tenant role is up to date")
            return
        result = db_roles.sync_all()
        self.stdout.write(
            f"ensured {len(result.ensured)} tenant role(s), dropped {len(result.dropped)} "
            f"of deleted tenants ({', '.join(result.dropped) or '-'}); skipped tenants without "
            f"a schema: {', '.join(result.skipped) or '-'}"
        )

    def _relay(self, loop: bool, interval: float | None, grace: float | None) -> None:
        import time

        from django.db import connections

        from ... import conf
        from ...relay import relay_pending

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

    def _list(self) -> None:
        rows = [("job", "queue", "retries", "kind", "grants")]
        for d in registry:
            kind = "system" if d.system else "tenant"
            rows.append(
                (
                    d.name,
                    queue_of(d),
                    str(d.retries if d.retries is not None else "-"),
                    kind,
                    ",".join(d.grants) or "-",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
