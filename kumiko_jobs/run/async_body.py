"""Run an ``async def`` job body from the (synchronous) runner, in the run's thread.

The body runs through asgiref's ``async_to_sync``: the coroutine gets an event loop in a helper
thread, while the run's own thread waits and serves every thread-sensitive ``sync_to_async``
call the coroutine makes. Django's async ORM is such a call, so its queries run in the run's
thread, on the worker's connection, inside everything the pipeline set up there: the tenant's
search path, the guard's execute wrappers, the run's context variables. (A query from another
thread, ``sync_to_async(thread_sensitive=False)`` or ``asyncio.to_thread``, opens a connection
of its own; the guard refuses that connection, see ``steps/db_guard.GuardSession.adopt``.)

A timeout must end the coroutine, not just the wait for it. The worker's alarm raises in the
run's thread only; the coroutine would go on in the loop thread, writing after the attempt was
recorded as timed out. So the timeout (``Alarm.note_timeout``) cancels the coroutine's task,
and the runner waits for the loop to finish, still serving its ORM calls (which the runner's
``_final_timeout`` refuses from then on), before the outcome is recorded.

In a sibling slot (worker/slots.py) the timeout is a timer's exception raised in the run's
thread, which Python delivers only when that thread runs bytecode; waiting here for the
coroutine, it runs none until the loop hands it work. So the slot's timer also calls ``wake``,
which hands the waiting thread an empty work item: the timeout is delivered at once and the
coroutine cancelled as above (without it, an async job awaiting past its timeout in a sibling
slot held its slot until the watchdog ended the whole process).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from asgiref.sync import AsyncToSync, async_to_sync

from .. import transport
from .state import RunState


class _Running:
    """The coroutine's task and loop, once it started, and a future set when it ended."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        self.executor: Any = None
        self.ended: concurrent.futures.Future[None] = concurrent.futures.Future()

    def cancel(self) -> None:
        """Safe from a signal handler in the run's thread: it only schedules the cancel."""
        loop, task = self.loop, self.task
        if loop is None or task is None or task.done():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing to cancel
            loop.call_soon_threadsafe(task.cancel)


# The coroutine each thread waits for now (thread ident -> its _Running), for ``wake``.
_awaiting: dict[int, _Running] = {}


def _nothing() -> None:
    """The work item ``wake`` hands a waiting thread: running it is the point."""


def wake(thread: int) -> None:
    """Let ``thread``, if it waits here for a coroutine, run bytecode now (module docstring).
    Safe from any thread; does nothing when ``thread`` awaits nothing."""
    running = _awaiting.get(thread)
    executor = running.executor if running is not None else None
    if executor is not None:
        # RuntimeError: the wait has just ended (the executor refuses new work).
        with contextlib.suppress(RuntimeError):
            executor.submit(_nothing)


def call_async(
    state: RunState, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any, **kwargs: Any
) -> Any:
    """``await func(*args, **kwargs)`` from this thread; cancelled when the timeout fires."""
    running = _Running()

    async def body() -> Any:
        running.loop = asyncio.get_running_loop()
        # The executor that runs this thread's share of the work (thread-sensitive sync calls).
        running.executor = AsyncToSync.loop_thread_executors.get(running.loop)
        running.task = asyncio.ensure_future(func(*args, **kwargs))
        try:
            if state.alarm.fired is not None:  # fired before the body got going
                running.task.cancel()
            return await running.task
        finally:
            running.ended.set_result(None)

    state.alarm.hooks.append(running.cancel)
    thread = threading.get_ident()
    _awaiting[thread] = running
    try:
        return async_to_sync(body)()
    except asyncio.CancelledError as exc:
        if state.alarm.fired is None:
            raise  # cancelled by the job's own code
        # Our cancellation, because the timeout fired: the attempt timed out, as a sync one.
        raise transport.JobTimeout(
            f"the attempt exceeded its timeout of {state.alarm.fired} s; the coroutine was "
            "cancelled"
        ) from exc
    except BaseException:
        # The alarm raised here, in this thread, while the coroutine was still running: cancel
        # it and wait for it to end (it may still await ORM calls while it unwinds, so keep
        # serving them). Only then may the runner record the outcome.
        # A coroutine not yet started (task None) never runs a line: body() sees the fired
        # timeout and cancels its task before the first step.
        if running.task is not None and not running.ended.done():
            running.cancel()
            running.executor.run_until_future(running.ended)
        raise
    finally:
        _awaiting.pop(thread, None)
        state.alarm.hooks.remove(running.cancel)
