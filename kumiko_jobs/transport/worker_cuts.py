"""A worker's own Redis calls outside RQ's loop, ridden through a cut connection.

RQ retries its blocking dequeue while Redis is away, and the worker mixins keep its loop's
bookkeeping going (worker/keeps_alive.py). What is left are the calls before and after the
loop: the worker's name on its connection (``CLIENT SETNAME``/``CLIENT INFO``, when the worker
is made), its registration (RQ's hash and sets, and the kumiko mark), its command channel
(``SUBSCRIBE``), and, from the SIGTERM handler, the date of a warm shutdown request. A client
that django-rq builds from a ``URL`` retries nothing (redis-py's connections get a ``Retry`` of
0 tries), so a command whose connection was cut in flight raised, and the worker process
exited 1 with only "Connection closed by server." to say why (the long soak: 35 workers, most
of them just started again, a few stopping).

Now each of those calls goes through ``cuts.through_cuts`` (as does the boot jobs' dataset
token, ``queues.boot_dataset_token``): tried ``TRIES`` times with a doubling pause, then the
worker exits with a line that says what failed and for how long. A
registration whose reply was lost had been applied: the next try finds the worker's own hash
(same host, pid and birth) and replaces it, where RQ would refuse it as another worker of the
same name. A shutdown request's date is RQ's bookkeeping: when it cannot be written, the
request still stands (it is in the process), and the handler does not wait for Redis.
"""

from __future__ import annotations

import logging
from typing import Any

from rq.utils import utcformat

from .cuts import CUT, through_cuts
from .worker_commands import mark_kumiko_worker

logger = logging.getLogger("kumiko_jobs.worker")


class RidesOutCuts:
    """Mixed into both worker bases (rq_worker.py): RQ's calls outside its loop, through cuts."""

    name: str
    key: str
    connection: Any
    pid: int | None
    hostname: str | None
    birth_date: Any
    pubsub: Any
    _birth_tried = False  # a registration was sent, maybe applied: the next try looks first

    def _set_ip_address(self, connection: Any) -> None:
        """RQ's ``CLIENT SETNAME``/``CLIENT INFO`` when the worker is made, through cuts."""
        parent = super()._set_ip_address  # type: ignore[misc]
        through_cuts(lambda: parent(connection), "naming its connection", f"worker {self.name}")

    def register_birth(self) -> None:
        """RQ's registration and the kumiko mark in its hash (by which liveness tells a kumiko
        worker from another class), through cuts."""
        parent = super().register_birth  # type: ignore[misc]

        def register() -> None:
            if self._birth_tried:
                self._forget_own_registration()
            self._birth_tried = True
            parent()
            mark_kumiko_worker(self.connection, self.key)

        try:
            through_cuts(register, "registering", f"worker {self.name}")
        finally:
            self._birth_tried = False

    def _forget_own_registration(self) -> None:
        """A try whose reply was lost may have registered this worker: its hash (this host,
        pid and birth) is removed, so the next try is not refused as a second worker."""
        if self.birth_date is None:
            return  # no try got as far as the registration's pipeline
        found = self.connection.hmget(self.key, "hostname", "pid", "birth")
        ours = (self.hostname or "", str(self.pid), utcformat(self.birth_date))
        if tuple(_text(value) for value in found) == ours:
            self.connection.delete(self.key)

    def subscribe(self) -> None:
        """RQ's command channel, through cuts (a half-made subscription is closed first)."""
        parent = super().subscribe  # type: ignore[misc]

        def subscribe() -> None:
            earlier = getattr(self, "pubsub", None)
            if earlier is not None:
                earlier.close()
            parent()

        through_cuts(subscribe, "subscribing to its command channel", f"worker {self.name}")

    def set_shutdown_requested_date(self) -> None:
        """RQ's note of a warm shutdown request (from the signal handler): skipped, with a line,
        when Redis is away; the request itself stands."""
        try:
            super().set_shutdown_requested_date()  # type: ignore[misc]
        except CUT as exc:
            logger.warning(
                "worker %s: could not note its shutdown request in Redis (%s); stopping anyway",
                self.name,
                exc,
            )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")
