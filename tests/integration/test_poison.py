"""Poison messages pushed straight into Redis, past ``enqueue``, to a real in-process worker.

Whoever can write to Redis can put anything in the queue. Whatever it is, the kumiko worker
keeps serving (a normal job queued after the poison still succeeds), records the poison (a
``RejectedMessage``, or a failed run for a message signed with the project's key but wrong),
runs no job body (no ``Probe`` row in any tenant) and enters no tenant schema (no
``SET search_path`` to a tenant while a poison message is handled).
"""

from __future__ import annotations

import json
import pickle
import re
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core import signing
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from django_tenants.utils import schema_context
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rq.serializers import JSONSerializer
from rq.worker import SimpleWorker as PlainRQWorker

from kumiko_jobs import transport
from kumiko_jobs.core.envelope import VERSION, Envelope, encode
from kumiko_jobs.definition.registry import registry
from kumiko_jobs.models import JobAttempt, JobRun, RejectedMessage, RunStatus
from kumiko_jobs.run.entry import execute
from kumiko_jobs.worker import refusal
from tests.conftest import TENANTS, probes, start_rqworker, work
from tests.testapp import jobs
from tests.testapp.models import Probe

RUNNER = transport.RUNNER
SALT = "kumiko_jobs.envelope.v2"
FUZZ = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# --- helpers ----------------------------------------------------------------------------------


def queue() -> Any:
    return transport.get_queue("default")


def push(*args: Any, **kwargs: Any) -> str:
    """An RQ message for the runner, as RQ itself would store it (JSON), past kumiko's enqueue."""
    return str(queue().enqueue_call(func=RUNNER, args=args, kwargs=kwargs).id)


def push_raw(fields: dict[str, Any], job_id: str | None = None) -> str:
    """A job hash written with plain Redis commands: whatever RQ would never write itself."""
    q = queue()
    job_id = job_id or f"poison-{uuid.uuid4().hex}"
    base = {
        "created_at": "2026-01-01T00:00:00.000000Z",
        "status": "queued",
        "origin": q.name,
        "description": "forged",
        "timeout": 30,
    }
    q.connection.hset(q.job_class.key_for(job_id), mapping={**base, **fields})
    q.connection.rpush(q.key, job_id)
    return job_id


def rq_data(func: str, args: list[Any], kwargs: dict[str, Any] | None = None) -> bytes:
    return JSONSerializer.dumps([func, None, args, kwargs or {}])


def signed(document: Any) -> str:
    """Signed with the project's own key and salt: forged by someone who holds SECRET_KEY."""
    payload = document if isinstance(document, str) else json.dumps(document)
    return signing.Signer(salt=SALT, algorithm="sha256").sign(payload)


def document(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "v": VERSION,
        "job": "testapp.probe",
        "schema": "t1",
        "kwargs": {"tag": "forged"},
        "run_id": uuid.uuid4().hex,
        "attempt": 1,
        "defers": 0,
        "gate_defers": 0,
        "correlation_id": "c",
        "triggered_by": None,
        "trigger": None,
        "trace": {},
        "origin": None,
        "parent_run_id": None,
        "tick": None,
        "signed_at": time.time(),
        "due_at": time.time(),
    }
    doc.update(changes)
    return doc


def rejected_since(mark: int) -> list[RejectedMessage]:
    return list(RejectedMessage.objects.filter(pk__gt=mark).order_by("pk"))


def rejected_mark() -> int:
    last = RejectedMessage.objects.order_by("-pk").values_list("pk", flat=True).first()
    return last or 0


def failed_rq_ids() -> set[str]:
    return set(queue().failed_job_registry.get_job_ids())


def all_probes() -> dict[str, list[str]]:
    return {schema: [p.tag for p in probes(schema)] for schema in TENANTS}


@dataclass
class SchemaEntries:
    """Every ``search_path`` statement on this thread's connection, by the RQ job running it.

    The in-process worker shares the test's connection, so a wrapper installed here sees what
    django-tenants sends when a run enters its tenant.
    """

    seen: list[tuple[str, str]] = field(default_factory=list)

    def __call__(
        self, execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any
    ) -> Any:
        text = str(sql)
        if "search_path" in text.lower():
            self.seen.append((transport.current_job_id(), text))
        return execute(sql, params, many, context)

    def tenant_entries(self) -> list[tuple[str, str]]:
        return [(job_id, sql) for job_id, sql in self.seen if _names_a_tenant(sql)]


def _names_a_tenant(sql: str) -> bool:
    rest = re.sub(r"(?i)\b(set|search_path|to|public)\b|[\"'=,;\s]", "", sql)
    return bool(rest)


@contextmanager
def watching_schemas() -> Iterator[SchemaEntries]:
    """Statements on the test's own connection, which the job body shares with DB_ROLES off
    (with it on, the body has a connection of its own: docs/guard.md, "Two walls")."""
    entries = SchemaEntries()
    with (
        override_settings(KUMIKO_JOBS={**django_settings.KUMIKO_JOBS, "DB_ROLES": False}),
        connection.execute_wrapper(entries),
    ):
        yield entries


@dataclass
class Batch:
    """Push poison, then one normal job, run one worker, and check what must hold."""

    mark: int = field(default_factory=rejected_mark)
    failed_before: set[str] = field(default_factory=failed_rq_ids)
    runs_before: set[uuid.UUID] = field(
        default_factory=lambda: set(JobRun.objects.values_list("pk", flat=True))
    )
    poison_ids: list[str] = field(default_factory=list)

    def add(self, rq_job_id: str) -> None:
        self.poison_ids.append(rq_job_id)

    def run(self, *, rq_leaves_ids: int = 0) -> tuple[list[RejectedMessage], list[JobRun]]:
        tag = f"control-{uuid.uuid4().hex[:8]}"
        control = jobs.probe.enqueue(tenant="t2", tag=tag)
        with watching_schemas() as entries:
            work()  # returns: the worker did not crash
        # The worker kept serving after the poison: the normal job behind it succeeded...
        run = JobRun.objects.get(pk=control.run_id)
        assert run.status == RunStatus.SUCCEEDED, (run.status, run.error_message)
        # ...and ran the only job body: one Probe row, in its own tenant.
        assert all_probes() == {"t1": [], "t2": [tag], "t3": []}
        # The recorder sees tenant entries (the control's), and only the control's.
        tenant_entries = entries.tenant_entries()
        assert tenant_entries, "the recorder saw no tenant search_path at all"
        assert {job_id for job_id, _ in tenant_entries} == {run.rq_job_id}, tenant_entries
        assert all('"t2"' in sql for _, sql in tenant_entries), tenant_entries
        assert connection.schema_name == "public"
        assert transport.queue_length("default") == 0
        assert transport.scheduled_job_ids("default") == []  # nothing retried or deferred
        q = queue()
        assert q.connection.llen(q.intermediate_queue_key) == rq_leaves_ids
        # Clean up for the next batch of the same hypothesis test.
        with schema_context("t2"):
            Probe.objects.filter(tag=tag).delete()
        new_runs = list(
            JobRun.objects.exclude(pk__in=[*self.runs_before, uuid.UUID(control.run_id)])
        )
        return rejected_since(self.mark), new_runs


# --- the threat is real: plain RQ calls what the message names --------------------------------


def test_plain_rq_worker_would_call_any_function_a_message_names(live_db, tmp_path):
    """The contrast to the next test: why kumiko's worker checks the function name."""
    marker = tmp_path / "called"
    q = queue()
    q.enqueue("os.system", f"touch {marker}")
    PlainRQWorker([q], connection=q.connection, serializer=JSONSerializer).work(burst=True)
    assert marker.exists()


# --- messages RQ would run but kumiko must not ------------------------------------------------


@pytest.mark.parametrize(
    ("func", "args"),
    [
        ("os.system", ["touch {marker}"]),
        ("subprocess.check_call", [["touch", "{marker}"]]),
        ("pathlib.Path.touch", ["{marker}"]),
        ("django.db.connection.set_schema", ["t1"]),  # would enter a tenant schema
        ("tests.testapp.jobs.probe.func", [{"attempt": 1}]),  # a job body, past the pipeline
        ("kumiko_jobs.runner.run_state", [None]),
        ("kumiko_jobs.runner.execute ", ["padded name"]),
        ("Kumiko_jobs.runner.execute", ["other case"]),
        ("execute", ["bare name"]),
        ("print", ["a builtin"]),
    ],
)
def test_a_message_naming_another_function_is_refused_and_never_called(
    tenants, tmp_path, func, args
):
    marker = tmp_path / "called"
    args = json.loads(json.dumps(args).replace("{marker}", str(marker)))
    batch = Batch()
    batch.add(str(queue().enqueue_call(func=func, args=args).id))
    rejected, runs = batch.run()
    assert not marker.exists()
    assert [r.rq_job_id for r in rejected] == batch.poison_ids
    assert f"names the function {func!r}" in rejected[0].reason
    assert "only call kumiko_jobs.runner.execute" in rejected[0].reason
    assert func in rejected[0].excerpt  # the message as received, for the operator
    assert runs == []
    assert set(batch.poison_ids) <= failed_rq_ids() - batch.failed_before


@pytest.mark.parametrize(
    ("args", "kwargs", "instance"),
    [
        ([], {}, None),
        (["a", "b"], {}, None),
        ([], {"message": "x"}, None),
        (["x"], {"extra": 1}, None),
        (["x"], {}, {"object": "to call the runner on"}),
        (["x"], {}, "a string instance"),
        ({"not": "a list"}, {}, None),
        (["x"], ["not", "a", "dict"], None),
    ],
)
def test_a_runner_message_with_the_wrong_arguments_is_refused(tenants, args, kwargs, instance):
    batch = Batch()
    data = JSONSerializer.dumps([RUNNER, instance, args, kwargs])
    batch.add(push_raw({"data": data}))
    rejected, runs = batch.run()
    assert [r.rq_job_id for r in rejected] == batch.poison_ids
    assert re.search(r"exactly one argument|names an instance", rejected[0].reason)
    assert runs == []
    assert set(batch.poison_ids) <= failed_rq_ids() - batch.failed_before


@pytest.mark.parametrize(
    ("hook_field", "value"),
    [
        ("failure_callback_name", "os.system"),
        ("success_callback_name", "os.system"),
        ("stopped_callback_name", "os.abort"),
        ("webhooks", json.dumps([{"url": "http://127.0.0.1:9/exfiltrate"}])),
    ],
)
def test_a_runner_message_with_rq_callbacks_or_webhooks_is_refused(tenants, hook_field, value):
    batch = Batch()
    # A correctly signed, runnable envelope: only the RQ hook makes it poison.
    body = encode(
        Envelope(job="testapp.probe", schema="t1", kwargs={"tag": "hooked"}, run_id="a" * 32)
    )
    batch.add(push_raw({"data": rq_data(RUNNER, [body]), hook_field: value}))
    rejected, runs = batch.run()
    assert [r.rq_job_id for r in rejected] == batch.poison_ids
    assert hook_field in rejected[0].reason
    assert runs == []  # the envelope never reached the runner


@pytest.mark.parametrize("job_class", [transport.WorkerJob, transport.JsonJob])
@pytest.mark.parametrize("hook_field", transport.HOOK_FIELDS)
def test_the_hook_check_sees_what_rq_loaded_with_either_job_class(tenants, job_class, hook_field):
    # kumiko's workers load jobs with WorkerJob, which notes the hook fields from RQ's own read;
    # a job loaded by any other class is checked against Redis instead.
    body = encode(Envelope(job="testapp.probe", schema="t1", kwargs={"tag": "h"}, run_id="b" * 32))
    clean = push_raw({"data": rq_data(RUNNER, [body])})
    hooked = push_raw({"data": rq_data(RUNNER, [body]), hook_field: "not even parseable"})
    redis = queue().connection
    assert refusal(job_class.fetch(clean, connection=redis), redis) is None
    reason = refusal(job_class.fetch(hooked, connection=redis), redis)
    assert reason is not None and hook_field in reason, reason


# --- messages RQ cannot read ------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        pickle.dumps(("os.system", None, ("touch /tmp/kumiko-pickled",), {})),
        zlib.compress(pickle.dumps(("os.system", None, ("id",), {}))),
        b"\x80\x04garbage",
        b"not json",
        b"null",
        b'["kumiko_jobs.runner.execute"]',
        b"[" * 100_000 + b"]" * 100_000,
        b"",
    ],
    ids=["pickle", "zlib-pickle", "bytes", "text", "null", "short-list", "deep", "empty"],
)
def test_message_data_rq_cannot_read_is_recorded(tenants, data):
    batch = Batch()
    batch.add(push_raw({"data": data}))
    rejected, runs = batch.run()
    assert [r.rq_job_id for r in rejected] == batch.poison_ids
    assert "RQ cannot read the message data" in rejected[0].reason
    assert "kumiko messages are JSON" in rejected[0].reason
    assert runs == []
    assert set(batch.poison_ids) <= failed_rq_ids() - batch.failed_before


@pytest.mark.parametrize(
    "fields",
    [
        {"created_at": "not a date"},
        {"status": "pwned"},
        {"timeout": "forever"},
        {"result_ttl": "long"},
        {"dependency_ids": "{not json"},
        {"number_of_retries": "many"},
    ],
)
def test_a_job_hash_rq_cannot_load_is_recorded_and_removed(tenants, fields):
    batch = Batch()
    job_id = push_raw({"data": rq_data(RUNNER, ["x"]), **fields})
    batch.add(job_id)
    rejected, runs = batch.run()
    assert [r.rq_job_id for r in rejected] == [job_id]
    assert "RQ cannot load the job" in rejected[0].reason
    assert runs == []
    assert not queue().connection.exists(queue().job_class.key_for(job_id))


def test_a_job_hash_without_data_is_recorded_and_removed(tenants):
    # Plain RQ takes it for a job that no longer exists and skips it silently, leaving the
    # hash in Redis and its id in the intermediate queue; kumiko's job class refuses it.
    batch = Batch()
    job_id = push_raw({"description": "no data field"})
    batch.add(job_id)
    rejected, runs = batch.run()
    assert [r.rq_job_id for r in rejected] == [job_id]
    assert "(MalformedJobHash: the job hash has no data field)" in rejected[0].reason
    assert "no data field" in rejected[0].excerpt  # what the hash held, for the operator
    assert runs == []
    assert not queue().connection.exists(queue().job_class.key_for(job_id))


def test_a_queue_entry_pointing_at_a_non_hash_is_recorded_and_removed(tenants):
    q = queue()
    batch = Batch()
    q.connection.set(q.job_class.key_for("wrong-type"), "a plain string")
    q.connection.rpush(q.key, "wrong-type")
    batch.add("wrong-type")
    rejected, _ = batch.run()
    assert [r.rq_job_id for r in rejected] == ["wrong-type"]
    assert "WRONGTYPE" in rejected[0].reason
    assert "string" in rejected[0].excerpt
    assert not q.connection.exists(q.job_class.key_for("wrong-type"))


# --- runner messages with a bad envelope ------------------------------------------------------


def test_bad_envelopes_of_every_kind_are_rejected_before_any_tenant(tenants):
    good = encode(
        Envelope(job="testapp.probe", schema="t1", kwargs={"tag": "good"}, run_id="b" * 32)
    )
    payload, _, signature = good.rpartition(":")
    poison: list[tuple[Any, str]] = [
        (None, "message is a NoneType"),
        (42, "message is a int"),
        ([good], "message is a list"),
        ({"job": "testapp.probe", "schema": "t1"}, "message is a dict"),
        (json.dumps(document()), "bad signature"),  # forged tenant, unsigned
        (payload.replace('"t1"', '"t3"') + ":" + signature, "bad signature"),
        (payload + ":" + signature[::-1], "bad signature"),
        (signing.Signer(key="x" * 50, salt=SALT).sign(payload), "bad signature"),
        (pickle.dumps(good).decode("latin-1"), "bad signature"),
        ("a\x00b", "bad signature"),
        ("\ud800:" + signature, "not valid Unicode"),
        ("x" * (512 * 1024 + 1), "over the 524288-byte limit"),
        (signed(document(kwargs={"tag": "x" * 600_000})), "over the 524288-byte limit"),
        (signed(document(v=3)), "unknown envelope version"),
        (signed(document(v=1)), "says version 1 but was signed as version 2"),
        (
            signed(document(signed_at=time.time() - 8 * 86400, due_at=time.time() - 8 * 86400)),
            "expired: run ",
        ),
        (signed(document(attempt=True)), "wrong type"),
        (signed(document(schema="public")), "public schema"),
        (signed(document(schema='t1"; SET search_path TO t2; --')), "not a valid schema"),
        (signed(document(run_id="B" * 32)), "run_id"),
        (signed({**document(), "func": "os.system"}), "do not match"),
        (signed(document(origin={"anonymous": "no", "path": "/", "public_intake": 1})), "origin"),
        (signed("[" * 50_000 + "]" * 50_000), "not JSON"),
    ]
    batch = Batch()
    for message, _ in poison:
        batch.add(push(message))
    rejected, runs = batch.run()
    assert [r.rq_job_id for r in rejected] == batch.poison_ids
    for row, (_, reason) in zip(rejected, poison, strict=True):
        assert reason in row.reason, (row.reason, reason)
        assert row.queue == "default"
    assert "\x00" not in rejected[9].excerpt and "\\x00" in rejected[9].excerpt
    assert runs == []


def test_a_signed_envelope_for_an_unknown_job_fails_its_run_closed_without_retry(tenants):
    run_id = uuid.uuid4().hex
    JobRun.objects.create(
        run_id=uuid.UUID(run_id),
        job_name="testapp.was_renamed",
        schema_name="t1",
        status=RunStatus.QUEUED,
        queue="default",
        max_attempts=5,
        queued_at=timezone.now(),
    )
    batch = Batch()
    batch.add(push(signed(document(job="testapp.was_renamed", run_id=run_id))))
    rejected, _ = batch.run()
    run = JobRun.objects.get(pk=run_id)
    assert (run.status, run.error_type, run.attempts) == (
        RunStatus.FAILED,
        "JobNotRegistered",
        1,
    )
    assert "No job named 'testapp.was_renamed'" in run.error_message
    assert rejected == []


def test_a_signed_envelope_for_an_unknown_job_without_a_run_is_rejected(tenants):
    batch = Batch()
    batch.add(push(signed(document(job="testapp.nope"))))
    rejected, runs = batch.run()
    assert [r.rq_job_id for r in rejected] == batch.poison_ids
    assert "No job named 'testapp.nope'" in rejected[0].reason
    assert runs == []


def _waiting_row(doc: dict[str, Any]) -> None:
    """The queued run a forged message claims (as if its enqueue had committed)."""
    JobRun.objects.create(
        run_id=uuid.UUID(doc["run_id"]),
        job_name=doc["job"],
        schema_name=doc["schema"] or "",
        status=RunStatus.QUEUED,
        queue="default",
        queued_at=timezone.now(),
    )


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"schema": "ghost"}, "tenant not found: no tenant has schema 'ghost'"),
        ({"schema": None}, "message for a tenant job names schema None"),
        ({"job": "testapp.system_tick", "schema": "t1"}, "a system job names schema 't1'"),
        ({"kwargs": {"tag": "x", "payload": {}, "tga": 1}}, "unexpected keyword argument"),
        ({"kwargs": {"tag": {"not": "primitive"}}}, "subject field 'tag' is a dict"),
    ],
)
def test_signed_envelopes_with_a_forged_tenant_or_arguments_fail_closed(tenants, changes, reason):
    """Signed with the key, well formed, but wrong: the run fails before its body, no fallback."""
    batch = Batch()
    doc = document(**changes)
    _waiting_row(doc)  # a run row exists: the message is not refused for lack of one
    batch.add(push(signed(doc)))
    rejected, runs = batch.run()
    assert rejected == []
    assert [run.run_id.hex for run in runs] == [doc["run_id"]]
    run = runs[0]
    assert run.status == RunStatus.FAILED
    assert run.error_type == "Unrecoverable"
    assert reason in run.error_message
    assert list(JobAttempt.objects.filter(run=run).values_list("number", "outcome")) == [
        (1, "failed")
    ]


# --- fuzzing ----------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
weird_text = st.text(
    alphabet=st.characters(codec=None, exclude_categories=()) | st.sampled_from(':\x00\ud800{}"'),
    max_size=60,
)


@FUZZ
@given(st.lists(json_values | weird_text, min_size=1, max_size=8))
def test_fuzz_random_json_arguments_are_rejected(tenants, messages):
    batch = Batch()
    for message in messages:
        batch.add(push(message))
    rejected, runs = batch.run()
    assert [r.rq_job_id for r in rejected] == batch.poison_ids
    for row, message in zip(rejected, messages, strict=True):
        expected = (
            "bad signature|not valid Unicode"
            if isinstance(message, str)
            else f"message is a {type(message).__name__}"
        )
        assert re.search(expected, row.reason), (row.reason, message)
    assert runs == []


_FIELD_TYPES = {
    "v": int,
    "job": str,
    "schema": (str, type(None)),
    "kwargs": dict,
    "run_id": str,
    "attempt": int,
    "defers": int,
    "gate_defers": int,
    "correlation_id": str,
    "triggered_by": (str, type(None)),
    "trigger": (str, type(None)),
    "trace": dict,
    "origin": (dict, type(None)),
    "parent_run_id": (str, type(None)),
    "tick": (str, type(None)),
    "signed_at": (int, float),
    "due_at": (int, float),
}


def _wrong_type(name: str) -> st.SearchStrategy[Any]:
    expected = _FIELD_TYPES[name]

    def is_wrong(value: Any) -> bool:
        if expected is int and isinstance(value, bool):
            return True
        return not isinstance(value, expected)

    return json_values.filter(is_wrong)


@st.composite
def forged_shapes(draw: st.DrawFn) -> dict[str, Any] | list[Any]:
    """A document with at least one thing wrong: a missing, extra or ill-typed field."""
    doc: dict[str, Any] = document()
    kind = draw(st.sampled_from(["drop", "extra", "type", "version", "not-object"]))
    if kind == "drop":
        for name in draw(st.lists(st.sampled_from(sorted(doc)), min_size=1, unique=True)):
            del doc[name]
    elif kind == "extra":
        name = draw(st.text(min_size=1, max_size=12).filter(lambda n: n not in doc))
        doc[name] = draw(json_values)
    elif kind == "type":
        for name in draw(st.lists(st.sampled_from(sorted(_FIELD_TYPES)), min_size=1, unique=True)):
            doc[name] = draw(_wrong_type(name))
    elif kind == "version":
        doc["v"] = draw(st.integers().filter(lambda v: v != VERSION))
    else:
        return draw(st.lists(json_values, max_size=3))
    return doc


@FUZZ
@given(st.lists(forged_shapes(), min_size=1, max_size=8))
def test_fuzz_signed_envelopes_of_the_wrong_shape_are_rejected(tenants, documents):
    batch = Batch()
    for doc in documents:
        batch.add(push(signed(doc)))
    rejected, runs = batch.run()
    assert [r.rq_job_id for r in rejected] == batch.poison_ids
    for row in rejected:
        assert re.search(
            r"unknown envelope version|do not match version|wrong type|not a JSON object"
            r"|but was signed as version",
            row.reason,
        ), row.reason
    assert runs == []


schema_names = st.from_regex(r"[a-z_][a-z0-9_]{0,20}", fullmatch=True).filter(
    lambda s: s not in (*TENANTS, "public")
)
job_names = st.from_regex(r"[a-z]{1,8}\.[a-z_]{1,16}", fullmatch=True).filter(
    lambda n: n not in registry
)
bad_origins = st.fixed_dictionaries(
    {"anonymous": json_values, "path": json_values, "public_intake": json_values}
).filter(
    lambda o: (
        not (
            type(o["anonymous"]) is bool
            and type(o["path"]) is str
            and type(o["public_intake"]) is bool
        )
    )
) | st.dictionaries(st.text(max_size=10), st.booleans(), max_size=4)


@FUZZ
@given(
    st.lists(
        st.one_of(
            schema_names.map(lambda s: ("tenant", document(schema=s))),
            job_names.map(lambda n: ("job", document(job=n))),
            bad_origins.map(lambda o: ("origin", document(origin=o))),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_fuzz_forged_tenants_jobs_and_origins_never_run(tenants, forged):
    batch = Batch()
    for _, doc in forged:
        batch.add(push(signed(doc)))
    rejected, runs = batch.run()
    by_run = {run.run_id.hex: run for run in runs}
    reasons = iter(rejected)
    for kind, doc in forged:
        if kind == "tenant":  # well formed, signed, but no run waits for it: never recreated
            assert "its history row is gone" in next(reasons).reason
        elif kind == "job":  # no run row to fail: recorded as a rejected message
            assert f"No job named {doc['job']!r}" in next(reasons).reason
        else:
            assert "write origin has the wrong shape" in next(reasons).reason
    assert by_run == {}
    assert next(reasons, None) is None


flips = st.lists(
    st.tuples(st.integers(min_value=0), st.characters(codec="ascii")), min_size=1, max_size=4
)


@FUZZ
@given(st.lists(flips, min_size=1, max_size=6))
def test_fuzz_flipped_characters_in_a_signed_message_are_rejected(tenants, flip_sets):
    """Each message is a good one (right key, right shape) with a few characters changed."""
    batch = Batch()
    for flip_set in flip_sets:
        good = encode(
            Envelope(job="testapp.probe", schema="t1", kwargs={"tag": "x"}, run_id=uuid.uuid4().hex)
        )
        chars = list(good)
        for index, char in flip_set:
            chars[index % len(chars)] = char
        tampered = "".join(chars)
        if tampered != good:
            batch.add(push(tampered))
    rejected, runs = batch.run()
    assert [r.rq_job_id for r in rejected] == batch.poison_ids
    for row in rejected:
        assert row.reason.startswith("bad signature"), row.reason
    assert runs == []


# --- other worker classes, as users start them ------------------------------------------------


@pytest.mark.parametrize(
    "worker_class", ["kumiko_jobs.worker.Worker", "kumiko_jobs.worker.ForkingWorker"]
)
def test_rqworker_processes_refuse_poison_and_keep_serving(tenants, tmp_path, worker_class):
    marker = tmp_path / "called"
    q = queue()
    q.enqueue("os.system", f"touch {marker}")
    push_raw({"data": pickle.dumps(("os.system", None, (f"touch {marker}",), {}))})
    push_raw({"data": rq_data(RUNNER, ["x"]), "created_at": "garbage"})
    push("not an envelope")
    control = jobs.probe.enqueue(tenant="t3", tag="after-poison")
    proc = start_rqworker("default", "--burst", "--worker-class", worker_class)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert not marker.exists()
    assert JobRun.objects.get(pk=control.run_id).status == RunStatus.SUCCEEDED, out
    assert all_probes() == {"t1": [], "t2": [], "t3": ["after-poison"]}
    reasons = sorted(r.reason.split(" (")[0].split(";")[0] for r in RejectedMessage.objects.all())
    assert reasons == [
        "RQ cannot load the job",
        "RQ cannot read the message data",
        "bad signature: the message was not signed by this project",
        "the message names the function 'os.system'",
    ], reasons


# --- execute() itself, without RQ -------------------------------------------------------------


def _deeply_nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("nul\x00in:the-message", "bad signature"),
        ("\ud800lone:surrogate", "not valid Unicode"),
        (b"bytes\x00", "message is a bytes"),
        (_deeply_nested(100_000), "message is a list"),
        ("", "bad signature"),
    ],
    ids=["nul", "surrogate", "bytes", "deep", "empty"],
)
def test_execute_records_any_argument_it_cannot_use(message, reason):
    # The one test here that asks pytest-django for its database (the others commit, for the
    # worker): execute() runs inside the test's rolled-back transaction.
    assert execute(message) == "rejected"
    row = RejectedMessage.objects.get()
    assert reason in row.reason
    assert "\x00" not in row.excerpt
    row.excerpt.encode("utf-8")  # storable text, whatever came in (raises on a surrogate)


def test_a_long_running_worker_carries_nothing_from_one_tenants_run_to_the_next(tenants):
    """The process-wide state added for speed, under attack: a ``manage.py rqworker`` without
    ``--burst`` (so it freezes its start-up heap, worker/classes.py, and keeps one signer per
    secret from its first message on, core/signer.py) serves three tenants' runs interleaved,
    with two messages among them that must not run: a t1 message re-pointed at t2 after it was
    signed, and one signed with another secret (a key the cached signer must not accept because
    a good message was verified before it). Each tenant's ``list_tags`` sees its own tenant's
    tags only; the two are rejected as badly signed and their runs never start."""
    good = [
        jobs.list_tags.enqueue(tenant=schema, tag=f"{schema}-{n}")
        for n in range(3)
        for schema in ("t1", "t2", "t3")
    ]
    reaimed = document(schema="t1", kwargs={"tag": "reaimed"})
    text = signed(reaimed)
    tampered = text.replace('"schema": "t1"', '"schema": "t2"')
    assert tampered != text
    reaimed["schema"] = "t2"
    foreign = document(schema="t3", kwargs={"tag": "foreign"})
    other_key = signing.Signer(key="not-this-project", salt=SALT, algorithm="sha256")
    for doc in (reaimed, foreign):
        _waiting_row(doc)  # a run waits for each: only the signature can refuse them
    push(tampered)
    push(other_key.sign(json.dumps(foreign)))
    good += [jobs.list_tags.enqueue(tenant=schema, tag=f"{schema}-last") for schema in TENANTS]
    mark = rejected_mark()
    proc = start_rqworker("default", "--worker-class", "kumiko_jobs.worker.Worker")
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            done = JobRun.objects.filter(pk__in=[h.run_id for h in good], status="succeeded")
            if done.count() == len(good) and len(rejected_since(mark)) >= 2:
                break
            time.sleep(0.2)
    finally:
        proc.terminate()  # a warm shutdown
        out, _ = proc.communicate(timeout=60)
    assert (
        JobRun.objects.filter(pk__in=[h.run_id for h in good]).exclude(status="succeeded").count()
        == 0
    ), out[-3000:]
    assert sum(len(probes(schema)) for schema in TENANTS) == len(good)
    for schema in TENANTS:
        for probe in probes(schema):
            seen = {tag.split("-")[0] for tag in probe.note.split(",") if tag}
            assert seen <= {schema}, probe.note  # the first run of each sees nothing yet
            assert probe.schema_seen == schema
    reasons = [r.reason for r in rejected_since(mark)]
    assert len(reasons) == 2 and all(r.startswith("bad signature") for r in reasons), reasons
    for doc in (reaimed, foreign):
        assert JobRun.objects.get(pk=doc["run_id"]).status == RunStatus.QUEUED
    assert "reaimed" not in str(all_probes()) and "foreign" not in str(all_probes())
