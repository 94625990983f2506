"""``async def`` jobs (test_async_jobs.py) and a job returning values of every kind
(test_results.py); imported by jobs.py."""

from __future__ import annotations

import asyncio
import threading
import time

from asgiref.sync import sync_to_async
from django.db import connection

from kumiko_jobs import EscapeHatch, job

from .models import Probe


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _schema_name() -> str:
    return str(connection.schema_name)


# ``connection`` read directly in a coroutine is the event loop thread's own (unused) wrapper,
# always in public; the async ORM runs in the run's thread, whose schema this reports.
schema_seen = sync_to_async(_schema_name)


def _mark(path: str, event: str) -> None:
    with open(path, "a") as marks:
        marks.write(f"{event}\n")


@job(escape_hatch=EscapeHatch(reason="reports its session's backend pid", grants=["unsafe_raw"]))
async def async_probe(ctx, *, tag: str) -> dict:
    """Writes and counts with the async ORM; returns what it saw, and its session's pid."""
    await Probe.objects.acreate(tag=tag, schema_seen=await schema_seen(), attempt=ctx.attempt)
    with ctx.unsafe_raw():  # pg_backend_pid() is outside the guard's function allowlist
        pid = await sync_to_async(_backend_pid)()
    return {"tag": tag, "count": await Probe.objects.acount(), "backend_pid": pid}


# The runs of ``async_meets`` that must be running at once (set by the test; broken after
# ``MEET_WITHIN`` seconds, and the waiting runs fail: then they did not run at once).
MEETING: dict[str, threading.Barrier] = {}
MEET_WITHIN = 60


@job(
    retries=0,
    escape_hatch=EscapeHatch(reason="reports its session's backend pid", grants=["unsafe_raw"]),
)
async def async_meets(ctx, *, tag: str) -> str:
    """Awaits the meeting of every run of it (``MEETING``), then writes with the async ORM in
    its tenant and returns its schema, its session's backend pid and its thread."""
    barrier = MEETING["runs"]
    await asyncio.get_running_loop().run_in_executor(None, barrier.wait, MEET_WITHIN)
    await Probe.objects.acreate(tag=tag, schema_seen=await schema_seen())
    with ctx.unsafe_raw():
        pid = await sync_to_async(_backend_pid)()
    thread = await sync_to_async(threading.get_ident)()
    return f"{await schema_seen()} {pid} {thread} {await Probe.objects.acount()}"


@job
async def async_writes_other(ctx, *, tag: str, other: str) -> None:
    """Writes its own tenant (allowed), then another tenant's table by raw SQL (refused)."""
    await Probe.objects.acreate(tag=tag, schema_seen=await schema_seen())

    def write_other() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                f'INSERT INTO "{other}".testapp_probe (tag, schema_seen, attempt, note) '
                "VALUES (%s, %s, 1, '')",
                [tag, "stolen"],
            )

    await sync_to_async(write_other)()


@job
async def async_other_thread(ctx, *, tag: str) -> None:
    """An ORM call in a thread of its own: a connection the guard cannot watch (refused)."""
    await sync_to_async(Probe.objects.count, thread_sensitive=False)()


@job(retries=2, backoff={"type": "fixed", "delay": 0})
async def async_flaky(ctx, *, tag: str, fail_times: int) -> str:
    await Probe.objects.acreate(tag=tag, schema_seen=await schema_seen(), attempt=ctx.attempt)
    if ctx.attempt <= fail_times:
        raise RuntimeError(f"async boom on attempt {ctx.attempt}")
    return f"done on attempt {ctx.attempt}"


@job
async def async_defers_once(ctx, *, tag: str) -> object:
    await Probe.objects.acreate(tag=tag, schema_seen=await schema_seen(), attempt=ctx.attempt)
    if await Probe.objects.filter(tag=tag).acount() == 1:
        return ctx.defer(0.1)
    return "resumed"


@job(timeout=1)
async def async_overruns(ctx, *, tag: str, marks: str, how: str) -> str:
    """Runs past its 1 s timeout: ``sleep`` awaits asyncio.sleep; ``orm`` keeps writing with
    the async ORM and swallows every Exception (the timeout included) raised in its calls;
    ``sync`` swallows the timeout raised inside a sync call (see below).
    Marks ``start``, ``tick`` per loop, ``caught <type>``, and ``cancelled`` when cancelled."""
    _mark(marks, "start")
    try:
        for _ in range(600):
            if how == "sleep":
                await asyncio.sleep(0.1)
            elif how == "sync":
                # A sync call in the run's thread that outlasts the timeout: the alarm raises
                # inside it, and the coroutine swallows that; then it writes (refused) and
                # goes on awaiting. Only the cancellation can end it.
                try:
                    await sync_to_async(time.sleep)(3)
                except Exception as exc:
                    _mark(marks, f"caught {type(exc).__name__}")
                try:
                    await Probe.objects.acreate(tag=tag, schema_seen="after the timeout")
                except Exception as exc:
                    _mark(marks, f"caught {type(exc).__name__}")
                await asyncio.sleep(0.1)
            else:
                try:
                    await Probe.objects.acreate(tag=tag, schema_seen=await schema_seen())
                except Exception as exc:
                    _mark(marks, f"caught {type(exc).__name__}")
                await asyncio.sleep(0.05)
            _mark(marks, "tick")
    except asyncio.CancelledError:
        _mark(marks, "cancelled")
        raise
    _mark(marks, "end")
    return "finished late"


@job
def returns(ctx, *, kind: str) -> object:
    """Returns a value of ``kind`` for the results tests."""
    values: dict[str, object] = {
        "dict": {"total": 3, "items": ["a", "b"], "ok": True},
        "string": "plain text",
        "none": None,
        "set": {1, 2},
        "nan": float("nan"),
        "nul": {"text": "a\x00b"},
        "huge": "x" * 100_000,
    }
    return values[kind]
