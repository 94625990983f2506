"""Fixtures shared by the two-walls suites (test_db_roles*.py); modules with a guard_data of
their own (the classifier's suites) keep theirs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
def observer() -> Iterator[support.Observer]:
    """The test's own second connection, which no run touches."""
    seen = support.Observer()
    yield seen
    seen.close()
