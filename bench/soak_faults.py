"""The soak's faults beyond worker kills and the Redis restart (bench/soak.py's ``run_soak``).

* **Terminations**: ``pg_terminate_backend`` of every session the soak's children (workers and
  rqscheduler) hold in the soak's database, what a PostgreSQL restart does to each of them,
  without restarting a server others share. The children are told apart by their
  ``application_name`` (``soak.CHILD_APP``, set by ``soak.manage``): the soak's own sessions,
  which enqueue and count, are never ended, so a refused enqueue never has to be guessed at.
* **The network**: the children reach PostgreSQL and Redis through tests/chaos/proxy.py, which
  adds latency per chunk during slow spells (one at the start, and with ``latency_every`` one
  every so often after it), and cuts every connection now and then throughout (the peers see
  the close).

Each fault is driven from the soak's main loop (``tick``), one clock for everything, so a seed
gives the same schedule. Each fault event is noted (``Events``), wall-clock stamped, so that the
report can tell which fault ended the attempt of a run whose effect happened twice.
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit


@dataclass
class Events:
    """The soak's fault events: (wall-clock time, kind, detail), in order."""

    path: Path | None = None  # also written here as they happen, one line each
    items: list[tuple[float, str, str]] = field(default_factory=list)

    def note(self, kind: str, detail: str = "") -> None:
        event = (time.time(), kind, detail)
        self.items.append(event)
        if self.path is not None:
            with self.path.open("a") as out:
                out.write(f"{event[0]:.3f} {kind} {detail}\n")

    def count(self, kind: str) -> int:
        return sum(1 for _, k, _ in self.items if k == kind)

    def first_after(
        self, at: float, kinds: tuple[str, ...], within: float
    ) -> tuple[float, str, str] | None:
        """The first event of ``kinds`` in (``at``, ``at + within``]."""
        for event in self.items:
            if event[1] in kinds and at < event[0] <= at + within:
                return event
        return None


@dataclass
class Terminator:
    """Every ``every`` seconds (a random span), end every session of the soak's children."""

    every: tuple[float, float]
    application_name: str
    rng: random.Random
    sessions_ended: int = 0
    rounds: int = 0
    events: Events | None = None
    _admin: Any = None
    _next: float = 0.0

    def start(self, now: float) -> None:
        import psycopg
        from django.db import connection

        s = connection.settings_dict
        self._admin = psycopg.connect(
            host=s["HOST"],
            port=s["PORT"],
            user=s["USER"],
            password=s["PASSWORD"] or "",
            dbname=s["NAME"],
            autocommit=True,
        )
        self._next = now + self.rng.uniform(*self.every)

    def tick(self, now: float) -> None:
        if self._admin is None or now < self._next:
            return
        rows = self._admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            [self.application_name],
        ).fetchall()
        ended = sum(1 for (done,) in rows if done)
        self.sessions_ended += ended
        self.rounds += 1
        if self.events is not None:
            self.events.note("terminate", f"{ended} sessions")
        self._next = now + self.rng.uniform(*self.every)

    def close(self) -> None:
        if self._admin is not None:
            with contextlib.suppress(Exception):
                self._admin.close()
            self._admin = None


@dataclass
class Network:
    """Proxies between the children and PostgreSQL and Redis: latency, then cuts."""

    cut_every: tuple[float, float] | None
    latency: tuple[float, float] | None
    latency_for: float
    rng: random.Random
    # A slow spell of ``latency_for`` s starts every MIN-MAX s after the first (None: only one).
    latency_every: tuple[float, float] | None = None
    events: Events | None = None
    cuts: int = 0
    connections_cut: int = 0
    slow_spells: int = 0
    slow_seconds: float = 0.0
    proxies: list[Any] = field(default_factory=list)
    _next: float = 0.0
    _fast_at: float = 0.0
    _slow_at: float | None = None  # when the next slow spell starts (None: no more)
    _slow_since: float | None = None

    def start(self, env: dict[str, str], redis_port: int, now: float) -> dict[str, str]:
        """Start the proxies; returns ``env`` with DATABASE_URL and REDIS_URL through them."""
        from django.db import connection

        from tests.chaos.proxy import Proxy

        db = connection.settings_dict
        pg = Proxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))).start()
        rd = Proxy(("127.0.0.1", redis_port)).start()
        self.proxies = [pg, rd]
        self._slow_at = now if self.latency is not None else None
        self._next = now + self.rng.uniform(*self.cut_every) if self.cut_every else 0.0
        self.tick(now)  # the first slow spell starts with the children
        out = dict(env)
        out["DATABASE_URL"] = _through(env["DATABASE_URL"], pg.url_netloc())
        out["REDIS_URL"] = _through(env["REDIS_URL"], rd.url_netloc())
        return out

    def slow(self, on: bool) -> None:
        for proxy in self.proxies:
            proxy.latency = self.latency if on else None

    def tick(self, now: float) -> None:
        if self.proxies and self._slow_since is not None and now >= self._fast_at:
            self.slow(False)
            self.slow_seconds += now - self._slow_since
            self._slow_since = None
            self._note("fast")
        if self.proxies and self._slow_at is not None and now >= self._slow_at:
            self.slow(True)
            self.slow_spells += 1
            self._slow_since = now
            self._fast_at = now + self.latency_for
            every = self.latency_every
            self._slow_at = now + self.rng.uniform(*every) if every else None
            self._note("slow")
        if not self.proxies or self.cut_every is None or now < self._next:
            return
        self.cuts += 1
        cut = sum(proxy.drop() for proxy in self.proxies) // 2
        self.connections_cut += cut
        self._next = now + self.rng.uniform(*self.cut_every)
        self._note("cut", f"{cut} connections")

    def _note(self, kind: str, detail: str = "") -> None:
        if self.events is not None:
            self.events.note(kind, detail)

    def close(self) -> None:
        if self._slow_since is not None:
            self.slow_seconds += time.monotonic() - self._slow_since
            self._slow_since = None
        for proxy in self.proxies:
            proxy.close()
        self.proxies = []


def _through(url: str, netloc: str) -> str:
    """``url`` with its host and port replaced by ``netloc`` (user and password kept)."""
    parts = urlsplit(url)
    credentials = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=credentials + netloc))
