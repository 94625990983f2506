"""A long-running worker leaves its start-up heap out of later garbage collections
(worker/classes.py, ``freeze_start_up_heap``); a burst worker does not freeze."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from kumiko_jobs.worker import boot, classes, stale_roles


class _Loop:
    def work(self, *args: Any, **kwargs: Any) -> bool:
        _Loop.frozen_at_loop = gc.get_freeze_count()
        return True

    frozen_at_loop = -1


class _Probe(classes.BootsFirst, _Loop):
    def queue_names(self) -> list[str]:
        return ["default"]


@pytest.fixture
def unfrozen(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The boot gates and boot jobs, and the roles' warning, are not this test's (they need
    # PostgreSQL and Redis).
    monkeypatch.setattr(boot, "on_worker_start", lambda *args, **kwargs: None)
    monkeypatch.setattr(stale_roles, "warn_stale_roles", lambda: [])
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_long_running_worker_freezes_before_its_first_message(unfrozen: None) -> None:
    assert gc.get_freeze_count() == 0
    assert _Probe().work(burst=False)
    assert _Loop.frozen_at_loop > 1000  # Django, the project, this test run: all frozen


def test_a_burst_worker_does_not_freeze(unfrozen: None) -> None:
    assert _Probe().work(burst=True)
    assert _Probe().work(True)
    assert _Loop.frozen_at_loop == 0
