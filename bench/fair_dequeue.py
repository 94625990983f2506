"""The fair dequeue's script alone, against Redis: does its cost grow with the number of
tenants with a backlog?

No database and no worker: ``--messages`` job hashes (with kumiko's fair field, spread over
``T`` tenants) are pushed onto a queue list, the way RQ pushes them; then the script sorts
them (at most 200 per call; the first call is timed on its own) and ``--picks`` dequeues
are timed, each followed by the finish's charge in a transaction as the worker sends it
(the sorting of the rest happens within them). The
baseline is RQ's own dequeue as kumiko's worker sent it before (``LMOVE`` and ``HGETALL`` in
one script) on the same list. Round trips per pick: one, in both.

    python -m bench.fair_dequeue [--tenants 1,100,10000] [--messages 20000] [--picks 5000]

Redis database 5 (flushed). A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from redis import Redis

fair: Any = None  # kumiko_jobs.transport.fair, imported once Django is set up (main)

QUEUE = "bench"
INBOX = f"rq:queue:{QUEUE}"
TAKEN = f"rq:queue:{QUEUE}:intermediate"
JOB_PREFIX = "rq:job:"
_PLAIN = """
local id = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
if not id then return false end
return {id, redis.call('HGETALL', ARGV[1] .. id)}
"""


def fill(redis: Redis, tenants: int, messages: int) -> None:
    redis.flushdb()
    with redis.pipeline(transaction=False) as pipe:
        for n in range(messages):
            job_id = f"kj-{n:032x}-a1-d0-g0"
            meta = {"kumiko_fair": [f"t{n % tenants}", 1.0, 0, "bench.job"]}
            pipe.hset(JOB_PREFIX + job_id, mapping={"data": "x", "meta": json.dumps(meta)})
            pipe.rpush(INBOX, job_id)
            if n % 1000 == 999:
                pipe.execute()
        pipe.execute()


def server_usec(redis: Redis) -> float:
    """Redis's own time per script call since the last reset (EVALSHA and EVAL), in µs:
    what the script costs the server, without this client's or the machine's noise."""
    stats = redis.info("commandstats")
    calls = sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("evalsha", "eval"))
    usec = sum(stats.get(f"cmdstat_{c}", {}).get("usec", 0) for c in ("evalsha", "eval"))
    return usec / calls if calls else 0.0


def time_fair(redis: Redis, picks: int) -> tuple[float, float]:
    """(seconds of the first call, which sorts everything; seconds per pick + charge after)."""
    started = time.perf_counter()
    first = fair.dequeue(redis, QUEUE, INBOX, TAKEN, JOB_PREFIX, "tenant")
    sorted_in = time.perf_counter() - started
    assert first[0]
    redis.config_resetstat()
    started = time.perf_counter()
    for _ in range(picks):
        reply = fair.dequeue(redis, QUEUE, INBOX, TAKEN, JOB_PREFIX, "tenant")
        charge = fair.Charge(reply[2].decode(), reply[3].decode(), float(reply[4]), 1.0, "tenant")
        with redis.pipeline() as pipe:
            fair.charge_on(pipe, charge, 0.01)
            pipe.execute()
    return sorted_in, (time.perf_counter() - started) / picks


def time_plain(redis: Redis, picks: int) -> float:
    script = redis.register_script(_PLAIN)
    script(keys=[INBOX, TAKEN], args=[JOB_PREFIX])
    redis.config_resetstat()
    started = time.perf_counter()
    for _ in range(picks):
        script(keys=[INBOX, TAKEN], args=[JOB_PREFIX])
        with redis.pipeline() as pipe:  # the finish transaction, without the charge
            pipe.exists("nothing")
            pipe.execute()
    return (time.perf_counter() - started) / picks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fair_dequeue", description=__doc__)
    parser.add_argument("--tenants", default="1,100,10000")
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--picks", type=int, default=5000)
    parser.add_argument("--redis-db", type=int, default=5)
    args = parser.parse_args(argv)
    global fair
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    import django

    django.setup()  # the transport package loads django-rq, which reads Django's settings
    from kumiko_jobs.transport import fair as fair_module

    fair = fair_module
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0").rsplit("/", 1)[0]
    redis = Redis.from_url(f"{url}/{args.redis_db}")
    print(f"load average at start {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    fill(redis, 1, args.messages)
    plain = time_plain(redis, args.picks)
    print(
        f"  RQ's dequeue (LMOVE + HGETALL script) + finish transaction: {plain * 1e6:.0f} µs "
        f"(Redis's time in the script: {server_usec(redis):.1f} µs)"
    )
    for tenants in (int(t) for t in args.tenants.split(",")):
        fill(redis, tenants, args.messages)
        sorted_in, per_pick = time_fair(redis, args.picks)
        print(
            f"  fair, {tenants:>6} tenants with backlog: pick + charge {per_pick * 1e6:.0f} µs "
            f"(Redis's time per script call, pick and charge: {server_usec(redis):.1f} µs); "
            f"the first call (it sorts the oldest 200 arrivals) took {sorted_in * 1e3:.1f} ms"
        )
    redis.flushdb()
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
