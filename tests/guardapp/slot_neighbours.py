"""The neighbours of the isolation suites at several slots (tests/slot_harness.py).

While a suite's own runs go one after another through one sibling slot of a ``KUMIKO_TEST_SLOTS``
worker, every other slot of the process runs one ``neighbour``: a run of another (or the same)
tenant that lasts until the suite's runs are done. Over and over, it checks that it still sees
only itself (its tenant's schema, its tenant's login under ``DB_ROLES``, the defaults of the
suites' context variable) and plants what the suites look for in *their* later runs (the
``LEAK`` variable, a translation, a time zone), so that state crossing between slots, either
way, fails the suite's run or the neighbour.
"""

from __future__ import annotations

import threading

from django.conf import settings
from django.db import connection
from django.utils import timezone, translation

from kumiko_jobs import job
from kumiko_jobs.run.context import JobContext

from .outlive_jobs import LEAK

STOP = threading.Event()  # set when the pinned slot has ended (every suite run done)
_arrived = threading.Condition()
_running = 0
_PAUSE = 0.005  # seconds between two looks; the neighbours must not starve the pinned slot


def begin() -> None:
    """Before a worker with neighbours starts: none running, none told to stop."""
    global _running
    with _arrived:
        _running = 0
    STOP.clear()


def wait_for(count: int, deadline: float) -> bool:
    """Until ``count`` neighbours run (or ``deadline`` seconds passed: then False)."""
    with _arrived:
        return _arrived.wait_for(lambda: _running >= count, timeout=deadline)


def _arrive() -> None:
    global _running
    with _arrived:
        _running += 1
        _arrived.notify_all()


@job(retries=0, queue="low")
def neighbour(ctx: JobContext, *, role: str | None) -> None:
    """Run beside the suite's runs until ``STOP``; raise on the first sign of another slot."""
    schema = ctx.tenant.schema_name
    mine = f"set-by-neighbour-{threading.current_thread().name}"
    # The main thread is the test's own: nothing is planted there (under a suite's calibration
    # the attempt's context would be the test's, and would outlive the worker).
    plants = threading.current_thread() is not threading.main_thread()
    _arrive()
    first = (translation.get_language(), timezone.get_current_timezone_name())
    if first != (settings.LANGUAGE_CODE, settings.TIME_ZONE):
        raise AssertionError(f"a neighbour in {schema} starts with {first}")
    while True:
        with connection.cursor() as cursor:
            cursor.execute("SELECT session_user, current_schema()")
            user, current = cursor.fetchone()
        if current != schema:
            raise AssertionError(f"a neighbour in {schema} runs in schema {current}")
        if role is not None and user != role:
            raise AssertionError(f"a neighbour in {schema} runs as {user}, not {role}")
        if LEAK.get() not in ("unset", mine):
            raise AssertionError(f"a neighbour in {schema} sees LEAK={LEAK.get()!r}")
        if plants:
            LEAK.set(mine)
            translation.activate("fr")
            timezone.activate("America/Lima")
        if STOP.wait(_PAUSE):
            return
