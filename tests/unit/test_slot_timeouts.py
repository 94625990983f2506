"""``worker.timeouts.SlotTimeout``: a sibling slot's timeout on the process's one alarm thread.

Real threads stand for slots; each body spins in bytecode (as a job's Python code does), so a
timeout raised in its thread is delivered at once. Every wait has a deadline far above the
timeouts; nothing asserts how long anything took. The end-to-end tests (real workers with
slots) are tests/integration/test_worker_slots.py and test_async_jobs.py.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from kumiko_jobs import transport
from kumiko_jobs.run.state import current_run
from kumiko_jobs.worker import timeouts
from kumiko_jobs.worker.timeouts import SlotTimeout

DEADLINE = 10.0  # seconds any body spins at most before the test gives up on the timeout


def _spin(stop: threading.Event | None = None) -> None:
    """Run bytecode until a timeout is raised in this thread (or ``stop``, or the deadline)."""
    give_up = time.monotonic() + DEADLINE
    while time.monotonic() < give_up and not (stop is not None and stop.is_set()):
        pass


def _in_thread(body: Callable[[], Any]) -> dict[str, Any]:
    """Run ``body`` in a thread of its own (a slot's); what it returned or raised."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["returned"] = body()
        except BaseException as exc:  # the timeout is a BaseException subclass's child
            out["raised"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(DEADLINE + 5)
    assert not thread.is_alive()
    return out


class _Run:
    """Stands for the run's state: the penalty notes the timeout on it."""

    def __init__(self) -> None:
        self.noted: list[int] = []

    def note_timeout(self, seconds: int) -> None:
        self.noted.append(seconds)


def test_the_timeout_is_raised_in_the_slots_thread_and_noted_on_its_run() -> None:
    run = _Run()

    def body() -> None:
        current_run.set(run)  # type: ignore[arg-type]
        with SlotTimeout(1, transport.JobTimeout):
            _spin()

    out = _in_thread(body)
    assert isinstance(out.get("raised"), transport.JobTimeout)
    assert type(out["raised"]).__name__ == "JobTimeoutException"  # the history's error type
    assert "maximum timeout value (1 seconds)" in str(out["raised"])
    assert run.noted == [1]


def test_a_withdrawn_timeout_never_fires() -> None:
    def body() -> str:
        with SlotTimeout(0.3, transport.JobTimeout):
            pass  # the body ends at once; its deadline is withdrawn
        time.sleep(0.6)  # past the deadline
        _spin(stop=_set_after(0.2))
        return "clean"

    assert _in_thread(body) == {"returned": "clean"}


def test_each_slot_has_its_own_deadline() -> None:
    """A short and a long timeout in two slots at once: only the short one's slot times out."""
    stop_long = threading.Event()
    results: dict[str, dict[str, Any]] = {}

    def slot(name: str, seconds: float, stop: threading.Event | None) -> None:
        def body() -> None:
            with SlotTimeout(seconds, transport.JobTimeout):
                _spin(stop)

        results[name] = _in_thread(body)

    long = threading.Thread(target=slot, args=("long", 60, stop_long))
    long.start()
    slot("short", 0.3, None)
    stop_long.set()
    long.join(DEADLINE + 5)
    assert isinstance(results["short"].get("raised"), transport.JobTimeout)
    assert results["long"] == {"returned": None}


def test_many_slots_share_one_alarm_thread_and_no_timer_thread() -> None:
    before = {t.ident for t in threading.enumerate()}
    hold = threading.Event()
    armed = threading.Barrier(9)

    def body() -> None:
        with SlotTimeout(60, transport.JobTimeout):
            armed.wait(DEADLINE)
            hold.wait(DEADLINE)

    slots = [threading.Thread(target=body) for _ in range(8)]
    for thread in slots:
        thread.start()
    armed.wait(DEADLINE)
    try:
        new = [t for t in threading.enumerate() if t.ident not in before and t not in slots]
        assert not [t for t in new if isinstance(t, threading.Timer)]
        alarms = [t for t in threading.enumerate() if t.name == "kumiko-slot-alarms"]
        assert len(alarms) == 1
    finally:
        hold.set()
        for thread in slots:
            thread.join(DEADLINE)


def test_withdrawn_deadlines_do_not_pile_up() -> None:
    """Runs far shorter than their timeout (an hour) leave the heap no longer than a few
    dozen entries, however many ran: memory stays flat over a long drain."""
    for _ in range(5000):
        with SlotTimeout(3600, transport.JobTimeout):
            pass
    assert timeouts._alarms.pending() <= 2 * timeouts._REBUILD_AFTER + 2


def test_a_nested_penalty_gives_the_thread_back_to_the_outer_one() -> None:
    """RQ arms a callback's penalty while none or another is armed: the outer one's timeout
    still finds its penalty (and its seconds) once the inner one is withdrawn."""

    def body() -> None:
        with SlotTimeout(1, transport.JobTimeout):
            with SlotTimeout(30, transport.JobTimeout):
                pass
            _spin()

    out = _in_thread(body)
    assert "maximum timeout value (1 seconds)" in str(out.get("raised"))


@pytest.mark.parametrize("seconds", [0, None])
def test_no_timeout_arms_nothing(seconds: Any) -> None:
    before = timeouts._alarms.pending()
    with SlotTimeout(seconds, transport.JobTimeout):
        pass
    assert timeouts._alarms.pending() == before


def _set_after(seconds: float) -> threading.Event:
    event = threading.Event()
    threading.Timer(seconds, event.set).start()
    return event


# Forking with threads running is what the test is about.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_starts_with_no_alarms() -> None:
    """A job that forks while slots' deadlines are armed: the child has no alarm thread and no
    deadlines of the parent's (no timer thread survived a fork before either), and arms its own
    on a thread of its own."""
    hold = threading.Event()
    armed = threading.Event()

    def slot() -> None:
        with SlotTimeout(60, transport.JobTimeout):
            armed.set()
            hold.wait(DEADLINE)

    thread = threading.Thread(target=slot)
    thread.start()
    armed.wait(DEADLINE)
    try:
        assert timeouts._alarms.pending() >= 1
        pid = os.fork()
        if pid == 0:  # the child: report through the exit code only
            fresh = timeouts._alarms.pending() == 0 and timeouts._alarms._thread is None
            out = _in_thread(lambda: _timed_spin(0.3)) if fresh else {}
            os._exit(0 if fresh and isinstance(out.get("raised"), transport.JobTimeout) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        hold.set()
        thread.join(DEADLINE)


def _timed_spin(seconds: float) -> None:
    with SlotTimeout(seconds, transport.JobTimeout):
        _spin()
