"""Fixtures shared by the two-walls suites (test_db_roles*.py; modules with a guard_data of
their own, the classifier's suites, keep theirs; ``cold_pool``, for the suites that watch a
run's first connection) and by the chaos suites (``procs``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kumiko_jobs.guard.roles import connections as tenant_connections
from tests.chaos.workers import Processes
from tests.guardapp import support


@pytest.fixture
def guard_data(live_db: None) -> Iterator[None]:
    """One secret per tenant and two shared plans; afterwards the worker's connections are
    closed whatever a run left on them, and the tables emptied."""
    support.seed()
    yield
    support.discard_worker_connections()
    support.clean()


@pytest.fixture
def cold_pool() -> Iterator[None]:
    """Every test starts without pooled tenant connections, so its first run connects; those
    its runs pooled are closed after it. Before ``live_db`` in ``usefixtures("cold_pool",
    "live_db")``, so closed after ``live_db``'s end too."""
    tenant_connections.close_all()
    yield
    tenant_connections.close_all()


@pytest.fixture
def observer() -> Iterator[support.Observer]:
    """The test's own second connection, which no run touches."""
    seen = support.Observer()
    yield seen
    seen.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """The test's worker and scheduler processes (tests/chaos/workers.py), all stopped at its
    end whatever it left running."""
    pool = Processes(tmp_path)
    yield pool
    pool.stop_all()
