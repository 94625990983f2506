"""The autoscaling signal in Prometheus' text format: queue depth, running runs, backlog per
worker. Labelled by queue only: a label per tenant would make one series per tenant (10,000
of them), which is what the operators' dashboard is for.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...history import shares
from ...transport import depths

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _family(name: str, help_text: str, samples: Iterable[tuple[str, float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    lines += [f"{name}{labels} {value:g}" for labels, value in samples]
    return lines


def _label(queue: str) -> str:
    escaped = queue.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{{queue="{escaped}"}}'


def exposition() -> str:
    """The metrics page. Raises the transport's ``RedisError`` when Redis cannot be read (the
    view answers 503: a scraper must not read an outage as an empty queue)."""
    queues = depths.queue_depths()
    listed, total = depths.workers()
    serving = {q.queue: 0 for q in queues}
    for worker in listed:
        for name in worker.queues:
            if name in serving:
                serving[name] += 1
    lines = _family(
        "kumiko_jobs_queue_depth",
        "Messages waiting on the queue (RQ's count; delayed ones are not on it yet).",
        [(_label(q.queue), q.waiting) for q in queues],
    )
    lines += _family(
        "kumiko_jobs_queue_started",
        "Messages of the queue that workers hold now (RQ's started registry).",
        [(_label(q.queue), q.started) for q in queues],
    )
    lines += _family(
        "kumiko_jobs_queue_workers",
        "Registered RQ workers listening on the queue.",
        [(_label(q.queue), serving[q.queue]) for q in queues],
    )
    lines += _family(
        "kumiko_jobs_backlog_per_worker",
        "Waiting messages per worker listening on the queue (the whole depth when none listens).",
        [(_label(q.queue), q.waiting / max(serving[q.queue], 1)) for q in queues],
    )
    lines += _family("kumiko_jobs_workers", "Registered RQ workers.", [("", total)])
    lines += _family(
        "kumiko_jobs_runs_running",
        "Runs the history records as running.",
        [("", shares.running_runs())],
    )
    return "\n".join(lines) + "\n"
