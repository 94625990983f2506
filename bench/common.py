"""What the flow-control benches share: their command line's database and Redis options, and
the session around a measurement (a fresh database and Redis db, tenants' worker logs in a
folder of their own, the machine's facts, and the clean-up however the run ends).

``throughput.py`` holds the set-up itself (``prepare_environment``, ``clean_up``); a bench
starts with ``parser(...)`` and runs inside ``session(args, "kumiko-<name>-")``. The benches
that fill a database once and measure its reads (admin_scale, dashboard_scale) share
``scale_parser`` instead.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.throughput import ROOT, clean_up, machine_facts, prepare_environment


def parser(prog: str, doc: str | None, *, database: str, redis_db: int) -> argparse.ArgumentParser:
    """The bench's parser (``python -m bench.<name>``, its docstring as description) with the
    options every bench of a fresh database takes: --json, --database, --redis-db and
    --keep-database."""
    made = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    made.add_argument("--json", action="store_true", help="also write bench/results/*.json")
    made.add_argument(
        "--database", default=database, help=f"database to create and drop ({database})"
    )
    made.add_argument(
        "--redis-db",
        type=int,
        default=redis_db,
        help=f"Redis database to flush and use ({redis_db})",
    )
    made.add_argument("--keep-database", action="store_true", help="do not drop it at the end")
    return made


@dataclass(frozen=True)
class Session:
    """One bench run: the admin database URL (for the clean-up), the results' time stamp, the
    folder the worker processes log to, and the machine's facts at the start."""

    admin_url: str
    stamp: str
    log_dir: Path
    machine: dict[str, Any]


@contextmanager
def session(args: argparse.Namespace, log_prefix: str) -> Iterator[Session]:
    """A fresh ``args.database`` and ``args.redis_db`` for the body, dropped afterwards unless
    ``--keep-database``."""
    sys.path.insert(0, str(ROOT))
    admin_url = prepare_environment(args.database, args.redis_db)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    log_dir = Path(tempfile.mkdtemp(prefix=log_prefix))
    try:
        yield Session(admin_url, stamp, log_dir, machine_facts())
    finally:
        clean_up(admin_url, args.database, keep_database=args.keep_database)


def scale_parser(doc: str | None) -> argparse.ArgumentParser:
    """The parser of a bench that fills a database once and measures reads of it (admin_scale,
    dashboard_scale): --reuse (a database that has the rows), --drop (at the end), --json."""
    made = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    made.add_argument("--reuse", action="store_true", help="keep a database that has the rows")
    made.add_argument("--drop", action="store_true", help="drop the database at the end")
    made.add_argument("--json", action="store_true")
    return made
