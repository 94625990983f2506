"""Real ``rqworker`` / ``rqscheduler`` processes with the settings a chaos test chooses.

``Processes.launch`` is the one way the suite starts such a process (the soak's ``manage``
command, its output to a log file of its own: a full pipe would block it); the crash tests'
``Workers`` (tests/integration/test_reliability.py) and the timeout tests' workers start theirs
through it too. Here the test's KUMIKO_JOBS overrides win over the crash tests' fast settings,
and each process may get its own environment (another DATABASE_URL or REDIS_URL: through a
proxy).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from bench import soak
from tests.conftest import ROOT, worker_env

# Fast recovery, as the crash tests (defaults: 1, 6, 10, 30 s).
FAST = {"WORKER_HEARTBEAT": 1, "WORKER_DEAD_AFTER": 3, "MAINTENANCE_INTERVAL": 1, "RELAY_GRACE": 2}
DEADLINE = 90.0  # a safety net for waits, not a measurement


def chaos_settings(**overrides: Any) -> dict[str, Any]:
    return {**settings.KUMIKO_JOBS, **FAST, **overrides}


class Processes:
    """Worker and scheduler processes of one test; all killed when it ends."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[subprocess.Popen[bytes]] = []
        self.log_paths: list[Path] = []  # each started process's log, in the same order

    def launch(
        self, argv: Sequence[str], env: dict[str, str], *, name: str = "proc"
    ) -> subprocess.Popen[bytes]:
        """``manage.py ARGV`` with exactly ``env``, logging to ``<name><n>.log``."""
        path = self.log_dir / f"{name}{len(self.started) + 1}.log"
        with path.open("ab") as log:
            proc = subprocess.Popen(
                soak.manage_command(*argv),
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.started.append(proc)
        self.log_paths.append(path)
        return proc

    def start(
        self,
        *argv: str,
        overrides: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        log_level: str = "WARNING",
    ) -> subprocess.Popen[bytes]:
        """``manage.py ARGV`` (default: a worker on the default queue)."""
        full = dict(worker_env())
        full.update(env or {})
        full[soak.SETTINGS_ENV] = json.dumps(chaos_settings(**(overrides or {})))
        full["KUMIKO_LOG"] = log_level
        return self.launch(argv or ("rqworker", "default"), full)

    def log_of(self, proc: subprocess.Popen[bytes]) -> str:
        """What ``proc`` (one of ours) has logged so far."""
        path = self.log_paths[self.started.index(proc)]
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-6000:]}"
            for path in sorted(self.log_dir.glob("*.log"))
        )

    def wait_for(
        self,
        what: str,
        check: Callable[[], bool],
        deadline: float = DEADLINE,
        explain: Callable[[], str] | None = None,
    ) -> None:
        """Until ``check()``; on giving up, the logs and ``explain()`` (the state to debug)."""
        end = time.monotonic() + deadline
        while not check():
            if time.monotonic() > end:
                state = f"\n{explain()}" if explain is not None else ""
                pytest.fail(f"gave up waiting for {what}\n{self.logs()}{state}")
            time.sleep(0.1)

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def wait_ready(self, workers: int, *, scheduler: bool = False) -> None:
        """Until ``workers`` kumiko workers beat (and an rqscheduler is registered): a process
        still starting up is not what a chaos test means to disturb."""
        from kumiko_jobs import transport
        from kumiko_jobs.transport import keys as transport_keys

        redis = transport.connection_for("default")

        def ready() -> bool:
            names = list(redis.smembers(transport_keys.LIVE_WORKERS))
            keys = [transport_keys.WORKER_KEY + (transport.decoded(n) or "") for n in names]
            beating = sum(1 for v in (redis.mget(keys) if keys else []) if v is not None)
            beating_enough = beating >= workers
            return beating_enough and (not scheduler or bool(redis.keys("rq:scheduler_instance:*")))

        self.wait_for(f"{workers} worker(s) beating", ready)
