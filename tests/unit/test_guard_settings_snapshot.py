"""The guard's snapshot of a connection's settings (guard/install.py ``_Snapshot``): what a run
could leave in ``settings_dict`` for later runs is noticed and restored, and nothing else is.
Pure: plain dicts, no database."""

from __future__ import annotations

import threading

from kumiko_jobs.guard.install import _Snapshot


def settings() -> dict[str, object]:
    return {
        "NAME": "db",
        "OPTIONS": {"options": "", "connect_timeout": 5},
        "TEST": {"NAME": "test_db"},
        "SCHEMA": "t1",  # django-tenants' own bookkeeping: ignored
    }


def test_unchanged_settings_match() -> None:
    now = settings()
    assert _Snapshot.of(now).matches(now)


def test_a_nested_change_is_seen_and_the_copy_is_the_old_value() -> None:
    now = settings()
    snap = _Snapshot.of(now)
    now["OPTIONS"]["options"] = "-c statement_timeout=1"  # type: ignore[index]
    assert not snap.matches(now)
    restored = snap.copy()
    assert restored["OPTIONS"] == {"options": "", "connect_timeout": 5}
    assert "SCHEMA" not in restored
    # A fresh copy each time: changing one does not change the next.
    restored["OPTIONS"]["connect_timeout"] = 1
    assert snap.copy()["OPTIONS"]["connect_timeout"] == 5


def test_the_tenants_own_key_may_change() -> None:
    now = settings()
    snap = _Snapshot.of(now)
    now["SCHEMA"] = "t2"
    assert snap.matches(now)


def test_a_key_put_back_in_another_order_still_matches() -> None:
    now = settings()
    snap = _Snapshot.of(now)
    test = now.pop("TEST")
    now["TEST"] = test  # same values, another order: the pickled bytes differ
    assert snap.matches(now)


def test_an_unpicklable_value_is_compared_by_copy() -> None:
    now = settings()
    now["OPTIONS"]["lock"] = threading.Lock  # a class pickles by reference  # type: ignore[index]
    now["HOOK"] = lambda: None  # a lambda does not pickle
    snap = _Snapshot.of(now)
    assert snap.matches(now)
    now["OPTIONS"]["options"] = "-c work_mem=1GB"  # type: ignore[index]
    assert not snap.matches(now)
    assert snap.copy()["OPTIONS"]["options"] == ""  # type: ignore[index]
