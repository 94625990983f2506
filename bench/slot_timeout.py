"""What a sibling slot's timeout costs per run: ``worker.timeouts.SlotTimeout`` armed and withdrawn.

Every run in a sibling slot (``WORKER_CONCURRENCY`` > 1) enters and leaves one
``SlotTimeout``; the body's own time is not part of it. This loop does just that, ``--runs``
times in a thread of its own (a slot's), with a timeout far longer than the loop, and prints
the process CPU (every thread's: an alarm or timer thread's work counts) and the wall time per
run, for ``--rounds`` rounds. No database or Redis: Django is set up with the unit tests'
settings, which connect to nothing.

    python -m bench.slot_timeout [--runs 20000] [--rounds 3]

To compare two versions, run it from each worktree in turn (``PYTHONPATH=<worktree>``).
A benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Sequence


def one_round(runs: int) -> tuple[float, float]:
    """Microseconds of process CPU and of wall time per run, over ``runs`` runs in a thread."""
    from kumiko_jobs import transport
    from kumiko_jobs.worker.timeouts import SlotTimeout

    out: list[tuple[float, float]] = []

    def slot() -> None:
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(runs):
            with SlotTimeout(180, transport.JobTimeout):
                pass
        out.append(
            (
                (time.process_time() - cpu) / runs * 1e6,
                (time.perf_counter() - wall) / runs * 1e6,
            )
        )

    thread = threading.Thread(target=slot)
    thread.start()
    thread.join()
    return out[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.slot_timeout", description=__doc__)
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings_unit")
    import django

    django.setup()
    print(f"load {os.getloadavg()[0]:.2f} at start")
    for n in range(1, args.rounds + 1):
        cpu, wall = one_round(args.runs)
        print(
            f"round {n}: {cpu:.1f} us CPU, {wall:.1f} us wall per run (armed and withdrawn); "
            f"threads now {threading.active_count()}"
        )
    print(f"load {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
