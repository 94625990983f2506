"""How long a killed worker's run waits before it starts again.

    python -m bench.dead_worker [--kills 20] [--workers 2] [--json]

On a database of its own (``kumiko_dead_worker``, created and dropped) and a Redis server of its
own (bench/soak.py's ``OwnRedis``), with the **default** liveness settings (``WORKER_HEARTBEAT``,
``WORKER_DEAD_AFTER``, ``MAINTENANCE_INTERVAL``; none is overridden), it starts ``--workers`` real
``rqworker`` processes and then, ``--kills`` times:

1. enqueues one ``soak.sleeper`` run (retries with no backoff; its first attempt sleeps 60 s);
2. waits until a worker executes it, and kills that worker with SIGKILL (no goodbye);
3. times from the kill to the start of the run's second attempt (its ``started_at`` as the
   worker recorded it; PostgreSQL and this script share the machine's clock), and
4. starts a replacement worker, and waits until every worker beats before the next kill.

It prints p50 / p99 / max of the restart times. The target (issue 28): p99 under 10 s. Measured
(20 kills, defaults 1 s / 6 s / 10 s, this 2-core machine): p50 6.39 s, p99 7.05 s, min 6.12 s.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.soak import QUEUE, SETTINGS_ENV, Child, OwnRedis, manage_command

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "kumiko_dead_worker"


def _wait(what: str, check: Any, deadline: float = 120.0) -> Any:
    end = time.monotonic() + deadline
    while not (found := check()):
        if time.monotonic() > end:
            raise RuntimeError(f"gave up waiting for {what}")
        time.sleep(0.02)
    return found


def _beating(redis: Any, names: list[str]) -> bool:
    from kumiko_jobs.transport import keys as transport_keys

    return all(redis.exists(transport_keys.WORKER_KEY + n) for n in names)


def _executing_worker(redis: Any, run_id: str) -> str | None:
    from kumiko_jobs import transport
    from kumiko_jobs.models import JobRun, RunStatus
    from kumiko_jobs.transport import keys as transport_keys

    row = JobRun.objects.filter(pk=run_id, status=RunStatus.RUNNING, attempts=1).first()
    if row is None or not row.rq_job_id:
        return None
    worker = transport.decoded(redis.hget(f"rq:job:{row.rq_job_id}", "worker_name"))
    # The worker's beat names the job: it is in the body now, not still taking the message.
    if worker and transport.decoded(redis.get(transport_keys.WORKER_KEY + worker)) == row.rq_job_id:
        return worker
    return None


def _restarted_at(run_id: str) -> float | None:
    from kumiko_jobs.models import JobRun

    row = JobRun.objects.filter(pk=run_id, attempts__gte=2).first()
    if row is None or row.started_at is None:
        return None
    return float(row.started_at.timestamp())


def measure(kills: int, workers: int, log_dir: Path, env: dict[str, str]) -> list[float]:
    from django.db import connections

    from bench import soak
    from kumiko_jobs import transport
    from kumiko_jobs.core import conf

    redis = transport.connection_for(QUEUE)
    serial = 0

    def start_one() -> Child:
        nonlocal serial
        serial += 1
        name = f"dw{serial}"
        child = Child(name, manage_command("rqworker", QUEUE, "--name", name), env, log_dir)
        child.start()
        return child

    pool = {child.name: child for child in (start_one() for _ in range(workers))}
    times: list[float] = []
    try:
        _wait("the workers' first beats", lambda: _beating(redis, list(pool)))
        # The sweep trusts a missing key only WORKER_DEAD_AFTER s after the first beat ever.
        time.sleep(conf.get().WORKER_DEAD_AFTER + 1)
        for n in range(kills):
            run_id = (
                soak.job("soak.sleeper").enqueue(tenant="bench1", tag=f"dw{n}", seconds=60).run_id
            )
            victim = _wait(
                "a worker in the body", functools.partial(_executing_worker, redis, run_id)
            )
            killed_at = time.time()
            pool.pop(victim).kill()
            restarted = _wait("the restart", functools.partial(_restarted_at, run_id))
            times.append(restarted - killed_at)
            print(f"  kill {n + 1}/{kills}: restarted after {times[-1]:.2f} s", flush=True)
            replacement = start_one()
            pool[replacement.name] = replacement
            _wait("every worker beating", lambda: _beating(redis, list(pool)))
            connections.close_all()
    finally:
        for child in pool.values():
            child.kill()
    return times


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dead_worker", description=__doc__)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    redis = OwnRedis().start()
    os.environ["REDIS_URL"] = redis.url()
    from bench.throughput import create_tenants, drop_database, prepare_environment

    admin_url = prepare_environment(DATABASE, 0)
    try:
        create_tenants(1)
        from kumiko_jobs.core import conf

        settings = conf.get()
        env = {**os.environ, "PYTHONPATH": str(ROOT), SETTINGS_ENV: "{}"}
        env.setdefault("KUMIKO_LOG", "ERROR")
        log_dir = Path(tempfile.mkdtemp(prefix="kumiko-dead-worker-"))
        print(
            f"defaults: WORKER_HEARTBEAT={settings.WORKER_HEARTBEAT} s, WORKER_DEAD_AFTER="
            f"{settings.WORKER_DEAD_AFTER} s, MAINTENANCE_INTERVAL={settings.MAINTENANCE_INTERVAL}"
            f" s; {args.workers} workers, {args.kills} kills (logs: {log_dir})"
        )
        times = measure(args.kills, args.workers, log_dir, env)
        result = {
            "kills": len(times),
            "p50_s": round(statistics.median(times), 2),
            "p99_s": round(_percentile(times, 0.99), 2),
            "max_s": round(max(times), 2),
            "min_s": round(min(times), 2),
        }
        print(
            f"kill -> restart: p50 {result['p50_s']} s, p99 {result['p99_s']} s, "
            f"max {result['max_s']} s, min {result['min_s']} s over {len(times)} kills"
        )
        if args.json:
            print(json.dumps(result))
        return 0 if result["p99_s"] < 10 else 1
    finally:
        from django.db import connections

        connections.close_all()
        drop_database(admin_url, DATABASE)
        redis.close()


if __name__ == "__main__":
    sys.exit(main())
