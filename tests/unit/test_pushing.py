"""Unit tests for the transport's pushing (transport/pushing.py): no Redis.

``pushing`` reaches Redis only through the handles ``queues`` gives it (``get_queue`` for a queue,
``delayed_set`` for rq-scheduler's set); ``Handles`` below stands in for both and notes every
call. Pinned: a message without a delay goes on its own queue (one pipeline per queue, in slices
of 500) under its job id, with the runner, its body, timeout, TTLs and front flag; a delayed one
goes to rq-scheduler's set, bound for its queue, never on the queue; a rate-limited one goes
through RQ's admission one by one (``enqueue_call`` with its ``RateLimit``), and a delayed
rate-limited one carries its limit on the scheduled job for when it is moved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from kumiko_jobs.transport import RUNNER, Message, pushing


@dataclass
class ScheduledJob:
    """What rq-scheduler's ``_create_job(commit=False)`` returns: a job, saved in a pipeline."""

    id: str
    rate_limit_key: str = ""
    rate_limit_concurrency: int = 0
    saved_in: list[Any] = field(default_factory=list)

    def save(self, pipeline: Any = None) -> None:
        self.saved_in.append(pipeline)


@dataclass
class Queue:
    name: str
    batches: list[list[Any]] = field(default_factory=list)
    calls: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)
    pipelines: list[QueuePipeline] = field(default_factory=list)

    def enqueue_many(self, data: list[Any], pipeline: QueuePipeline | None = None) -> None:
        assert pipeline is not None and not pipeline.executed  # in the push's own pipeline
        pipeline.commands.append(("enqueue_many", len(data)))
        self.batches.append(list(data))

    @property
    def connection(self) -> Queue:
        return self

    def pipeline(self) -> QueuePipeline:
        pipe = QueuePipeline()
        self.pipelines.append(pipe)
        return pipe

    def enqueue_call(self, func: Any, **kwargs: Any) -> None:
        self.calls.append((func, kwargs))


@dataclass
class QueuePipeline:
    """A queue's pipeline: the batch and its doorbell ring, executed together."""

    commands: list[tuple[Any, ...]] = field(default_factory=list)
    executed: bool = False

    def __enter__(self) -> QueuePipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def lpush(self, key: str, *values: str) -> None:
        self.commands.append(("lpush", key, len(values)))

    def ltrim(self, key: str, start: int, end: int) -> None:
        self.commands.append(("ltrim", key, start, end))

    def execute(self) -> None:
        self.executed = True


@dataclass
class DelayedSet:
    """rq-scheduler's set: jobs made unsaved, then saved and scored in one pipeline."""

    queue: str
    scheduled_jobs_key: str = "rq:scheduler:scheduled_jobs"
    created: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[ScheduledJob] = field(default_factory=list)
    pipelines: list[Pipeline] = field(default_factory=list)

    def _create_job(self, func: Any, **kwargs: Any) -> ScheduledJob:
        self.created.append({"func": func, **kwargs})
        job = ScheduledJob(kwargs["id"])
        self.jobs.append(job)
        return job

    @property
    def connection(self) -> DelayedSet:
        return self

    def pipeline(self) -> Pipeline:
        pipe = Pipeline()
        self.pipelines.append(pipe)
        return pipe

    @property
    def scores(self) -> dict[str, float]:
        return {k: v for p in self.pipelines if p.executed for k, v in p.zadded.items()}


@dataclass
class Pipeline:
    zadded: dict[str, float] = field(default_factory=dict)
    executed: bool = False

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def zadd(self, key: str, mapping: dict[str, float]) -> None:
        assert key == "rq:scheduler:scheduled_jobs"
        self.zadded.update(mapping)

    def execute(self) -> None:
        self.executed = True


class Handles:
    """``get_queue`` and ``delayed_set``, one fake per queue name."""

    def __init__(self) -> None:
        self.queues: dict[str, Queue] = {}
        self.delayed: dict[str, DelayedSet] = {}

    def get_queue(self, name: str) -> Queue:
        return self.queues.setdefault(name, Queue(name))

    def delayed_set(self, queue: str) -> DelayedSet:
        return self.delayed.setdefault(queue, DelayedSet(queue))


@pytest.fixture
def redis(monkeypatch: pytest.MonkeyPatch) -> Handles:
    handles = Handles()
    monkeypatch.setattr(pushing, "get_queue", handles.get_queue)
    monkeypatch.setattr(pushing, "delayed_set", handles.delayed_set)
    return handles


def message(n: int = 1, **fields: Any) -> Message:
    return Message(
        **({"body": f"signed-{n}", "queue": "default", "job_id": f"kj-{n}", "timeout": 60} | fields)
    )


TTLS = {**settings.KUMIKO_JOBS, "RESULT_TTL": 111, "FAILURE_TTL": 222}


@override_settings(KUMIKO_JOBS=TTLS)
def test_a_message_goes_on_its_queue_under_its_job_id(redis: Handles) -> None:
    pushing.push(message(1, queue="mail", timeout=90))
    assert set(redis.queues) == {"mail"}
    assert redis.delayed == {}
    [[data]] = redis.queues["mail"].batches
    assert data.func == RUNNER
    assert data.args == ("signed-1",)
    assert data.job_id == "kj-1"
    assert data.timeout == 90
    assert (data.result_ttl, data.failure_ttl) == (111, 222)
    assert data.at_front is False
    assert redis.queues["mail"].calls == []


def test_a_message_for_the_front_of_its_queue_says_so(redis: Handles) -> None:
    pushing.push(message(at_front=True))
    [[data]] = redis.get_queue("default").batches
    assert data.at_front is True


def test_one_pipeline_per_queue_in_the_order_given(redis: Handles) -> None:
    pushing.push_many([message(1), message(2, queue="mail"), message(3), message(4, queue="mail")])
    assert [[d.job_id for d in b] for b in redis.queues["default"].batches] == [["kj-1", "kj-3"]]
    assert [[d.job_id for d in b] for b in redis.queues["mail"].batches] == [["kj-2", "kj-4"]]


def test_thousands_go_in_slices_of_500(redis: Handles) -> None:
    pushing.push_many(message(n) for n in range(1201))
    batches = redis.queues["default"].batches
    assert [len(b) for b in batches] == [500, 500, 201]
    assert [d.job_id for b in batches for d in b] == [f"kj-{n}" for n in range(1201)]


def test_each_slice_rings_its_queues_doorbell_in_the_same_pipeline(redis: Handles) -> None:
    """One ring per message, capped (doorbell.BELL_SIZE), executed with the slice."""
    pushing.push_many([message(1), message(2, queue="mail"), message(3)])
    bell = "kumiko:fair:default:bell"
    [pipe] = redis.queues["default"].pipelines
    assert pipe.executed
    assert pipe.commands == [("enqueue_many", 2), ("lpush", bell, 2), ("ltrim", bell, 0, 63)]
    [mail] = redis.queues["mail"].pipelines
    assert mail.commands[1] == ("lpush", "kumiko:fair:mail:bell", 1)
    pushing.push_many(message(n) for n in range(100))
    assert redis.queues["default"].pipelines[-1].commands[1] == ("lpush", bell, 64)


@override_settings(KUMIKO_JOBS=TTLS)
def test_a_delayed_message_goes_to_the_scheduler_not_the_queue(
    redis: Handles, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pushing.time, "time", lambda: 1_900_000_000.25)
    pushing.push(message(1, queue="mail", delay=30.5, timeout=90))
    assert redis.queues == {}
    delayed = redis.delayed["mail"]
    assert delayed.created == [
        {
            "func": RUNNER,
            "args": ("signed-1",),
            "id": "kj-1",
            "timeout": 90,
            "result_ttl": 111,
            "queue_name": "mail",
            "meta": None,  # the message() here has no fair field
            "commit": False,
        }
    ]
    # Saved and scored in one pipeline, due to the microsecond (not truncated to 1_900_000_030).
    [pipe] = delayed.pipelines
    assert delayed.jobs[0].saved_in == [pipe]
    assert delayed.scores == {"kj-1": 1_900_000_030.75}


def test_a_zero_delay_is_no_delay(redis: Handles) -> None:
    pushing.push(message(delay=0.0))
    assert redis.delayed == {}
    assert len(redis.queues["default"].batches) == 1


def test_a_rate_limited_message_is_admitted_by_rq_one_by_one(redis: Handles) -> None:
    limited = [
        message(n, rate_limit_key="kj:seq:unit:t1", rate_limit=1, at_front=n == 2) for n in (1, 2)
    ]
    pushing.push_many([*limited, message(3)])
    queue = redis.queues["default"]
    assert [[d.job_id for d in b] for b in queue.batches] == [["kj-3"]]
    assert [kwargs["job_id"] for _, kwargs in queue.calls] == ["kj-1", "kj-2"]
    func, kwargs = queue.calls[1]
    assert func == RUNNER
    assert kwargs["args"] == ("signed-2",)
    assert kwargs["at_front"] is True
    limit = kwargs["rate_limit"]
    assert (limit.key, limit.concurrency) == ("kj:seq:unit:t1", 1)


def test_a_delayed_rate_limited_message_keeps_its_limit_for_the_move(redis: Handles) -> None:
    pushing.push(message(1, delay=10, rate_limit_key="kj:seq:unit:t1", rate_limit=3))
    assert redis.queues == {}
    [job] = redis.delayed["default"].jobs
    assert (job.rate_limit_key, job.rate_limit_concurrency) == ("kj:seq:unit:t1", 3)
    assert len(job.saved_in) == 1  # saved once, with its limit, in the scoring pipeline
