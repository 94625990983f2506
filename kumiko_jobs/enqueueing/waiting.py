"""``handle.wait(timeout)``: block until a run (or a workflow) is final, without polling.

The waiter reads the row once (it may be final already; from a tenant's context another
tenant's id is "does not exist" before anything else happens), then blocks on the id's done
signal in Redis (``transport.done``: the worker's finish pipeline pushes it, no round trip
more per run), and reads the row once more when it comes. The signal is a wake-up, not the
truth: ``WAIT_RECHECK`` seconds without one, the row is read again anyway, for the runs that
end outside a worker's finish (cancelled while queued, failed by the sweep, finished by a
forking worker). So a wait costs one read at the start, one at the end, and one per
``WAIT_RECHECK`` seconds of waiting, whatever the number of waiters.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from asgiref.sync import sync_to_async

from .. import transport
from ..core import conf
from ..core.exceptions import InvalidJob, WaitTimeout


def _checked(timeout: float) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise InvalidJob(f"wait() needs a timeout in seconds above 0, got {timeout!r}.")
    return float(timeout)


def _late(what: str, timeout: float) -> WaitTimeout:
    return WaitTimeout(
        f"{what} had not finished after {timeout} s. Wait longer, or look at it in the admin "
        "(is a worker running its queue?)."
    )


def wait(some_id: str, queue: str, timeout: float, is_final: Callable[[], bool], what: str) -> None:
    """Return once ``is_final()`` (a read of the row) says so; ``WaitTimeout`` after
    ``timeout`` seconds. ``queue``: where the finishing worker signals (its Redis)."""
    deadline = time.monotonic() + _checked(timeout)
    recheck = conf.get().WAIT_RECHECK
    trust_signal = True
    while not is_final():
        left = deadline - time.monotonic()
        if left <= 0:
            raise _late(what, timeout)
        if trust_signal:
            # A token while the row is not final (a signal without its commit, or a token
            # left by an earlier wait): sleep the slices from now on, never spin on it.
            trust_signal = not transport.wait_for(some_id, min(left, recheck), queue)
        else:
            time.sleep(min(left, recheck))


async def await_(
    some_id: str, queue: str, timeout: float, is_final: Callable[[], bool], what: str
) -> None:
    """``wait`` for async code: the blocking wait in a worker thread, the row's reads on
    Django's thread for sync code (``sync_to_async``), as ``arefresh`` does."""
    read = sync_to_async(is_final)
    block = sync_to_async(transport.wait_for, thread_sensitive=False)
    deadline = time.monotonic() + _checked(timeout)
    recheck = conf.get().WAIT_RECHECK
    trust_signal = True
    while not await read():
        left = deadline - time.monotonic()
        if left <= 0:
            raise _late(what, timeout)
        if trust_signal:
            trust_signal = not await block(some_id, min(left, recheck), queue)
        else:
            await asyncio.sleep(min(left, recheck))
