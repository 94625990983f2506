"""rq-scheduler's lock, short-lived and renewed by its live holder.

Every round of ``rqscheduler`` (moving due messages, ringing cron alarms) runs under one lock
in Redis, ``rq:scheduler_lock``, so that several schedulers never move the same message at
once. rq-scheduler sets it to expire ``--interval + 10`` seconds after it was taken: a scheduler
killed inside its round (SIGKILL, OOM, a lost machine) left it for 11 s with ``--interval 1``,
no other scheduler rang anything meanwhile, and the cron ticks of those seconds were lost
(test_chaos_cron: 9 of 303 with 154 kills).

Here the lock lives ``SCHEDULER_LOCK_TTL`` seconds (1 by default) and the holder's own thread
renews it every third of that for as long as its round runs, so a live scheduler keeps it
through a long round (a cron fan-out, a slow PostgreSQL) while a dead one hands it over within
the TTL. The lock's value is a token of its holder: renewal and release are compare-and-set
scripts, so a holder whose lock expired (a process stopped for longer than the TTL) can
neither extend nor delete the next holder's lock, and learns that it lost it (``lost``): its
round stops before the next message. What no lock can prevent: a holder stopped longer than
the TTL in the middle of moving one message, which it finishes after it wakes while another
scheduler moves the rest. A message moved twice is delivered twice with the same RQ job id,
and the run's record drops the second delivery; a cron tick fired twice finds its run row.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from typing import Any

from redis.exceptions import RedisError

# Extend (PEXPIRE) / delete the lock only while it still holds this holder's token.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class RenewedLock:
    """One scheduler's hold on the lock: ``acquire``, renewal while held, ``release``."""

    def __init__(self, redis: Any, key: str, ttl: float) -> None:
        self._redis = redis
        self._key = key
        self._ttl_ms = max(int(ttl * 1000), 1)
        self._token = uuid.uuid4().hex
        self._held = False
        self._lost = False
        self._wake = threading.Event()
        self._guard = threading.Lock()
        self._renewer: threading.Thread | None = None

    @property
    def lost(self) -> bool:
        """The lock expired or went to another holder while this one believed it held it."""
        return self._lost

    def acquire(self, *, renew: bool) -> bool:
        """Take the lock if nobody holds it; with ``renew``, keep it alive until ``release``."""
        taken = bool(self._redis.set(self._key, self._token, nx=True, px=self._ttl_ms))
        with self._guard:
            self._held, self._lost = taken, False
        if taken and renew:
            self._start_renewer()
            self._wake.set()
        return taken

    def release(self) -> None:
        """Give the lock back (only if it is still ours: never the next holder's)."""
        with self._guard:
            held, self._held = self._held, False
        if held:
            with contextlib.suppress(RedisError):
                self._redis.eval(_RELEASE, 1, self._key, self._token)

    def _start_renewer(self) -> None:
        if self._renewer is None or not self._renewer.is_alive():
            self._renewer = threading.Thread(
                target=self._renew_while_held, name="kumiko-scheduler-lock", daemon=True
            )
            self._renewer.start()

    def _renew_while_held(self) -> None:
        """The renewer thread: every third of the TTL while held; idle (no Redis) otherwise."""
        period = self._ttl_ms / 3000
        while True:
            self._wake.wait()
            self._wake.clear()
            while self._held:
                if self._wake.wait(period):
                    self._wake.clear()
                    continue  # taken again just now: a fresh TTL
                try:
                    kept = bool(self._redis.eval(_RENEW, 1, self._key, self._token, self._ttl_ms))
                except RedisError:
                    kept = False  # cannot tell: the TTL runs out, so count it lost
                with self._guard:
                    # (released meanwhile: the script found another token or none; not lost)
                    if not kept and self._held:
                        self._held, self._lost = False, True
