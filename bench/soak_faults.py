"""The soak's faults beyond worker kills and the Redis restart (bench/soak.py's ``run_soak``).

* **Terminations**: ``pg_terminate_backend`` of every session the soak's children (workers and
  rqscheduler) hold in the soak's database, what a PostgreSQL restart does to each of them,
  without restarting a server others share. The children are told apart by their
  ``application_name`` (``soak.CHILD_APP``, set by ``soak.manage``): the soak's own sessions,
  which enqueue and count, are never ended, so a refused enqueue never has to be guessed at.
* **The network**: the children reach PostgreSQL and Redis through tests/chaos/proxy.py, which
  adds latency per chunk during a slow spell at the start, and cuts every connection now and
  then throughout (the peers see the close).

Each fault is driven from the soak's main loop (``tick``), one clock for everything, so a seed
gives the same schedule.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit


@dataclass
class Terminator:
    """Every ``every`` seconds (a random span), end every session of the soak's children."""

    every: tuple[float, float]
    application_name: str
    rng: random.Random
    sessions_ended: int = 0
    rounds: int = 0
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
        self.sessions_ended += sum(1 for (done,) in rows if done)
        self.rounds += 1
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
    cuts: int = 0
    connections_cut: int = 0
    proxies: list[Any] = field(default_factory=list)
    _next: float = 0.0
    _fast_at: float = 0.0

    def start(self, env: dict[str, str], redis_port: int, now: float) -> dict[str, str]:
        """Start the proxies; returns ``env`` with DATABASE_URL and REDIS_URL through them."""
        from django.db import connection

        from tests.chaos.proxy import Proxy

        db = connection.settings_dict
        pg = Proxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))).start()
        rd = Proxy(("127.0.0.1", redis_port)).start()
        self.proxies = [pg, rd]
        self.slow(True)
        self._fast_at = now + self.latency_for
        self._next = now + self.rng.uniform(*self.cut_every) if self.cut_every else 0.0
        out = dict(env)
        out["DATABASE_URL"] = _through(env["DATABASE_URL"], pg.url_netloc())
        out["REDIS_URL"] = _through(env["REDIS_URL"], rd.url_netloc())
        return out

    def slow(self, on: bool) -> None:
        for proxy in self.proxies:
            proxy.latency = self.latency if on else None

    def tick(self, now: float) -> None:
        if self.proxies and self.latency is not None and now >= self._fast_at:
            self.slow(False)
        if not self.proxies or self.cut_every is None or now < self._next:
            return
        self.cuts += 1
        self.connections_cut += sum(proxy.drop() for proxy in self.proxies) // 2
        self._next = now + self.rng.uniform(*self.cut_every)

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()
        self.proxies = []


def _through(url: str, netloc: str) -> str:
    """``url`` with its host and port replaced by ``netloc`` (user and password kept)."""
    parts = urlsplit(url)
    credentials = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=credentials + netloc))
