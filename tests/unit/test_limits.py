"""Unit tests for the bounds on values that reach bounded columns or grow without limit.

Settings only: no database, no Redis. Each bound is tested at its limit and just past it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from kumiko_jobs import InvalidJob, TenantVisibleError
from kumiko_jobs.core import conf as conf_module
from kumiko_jobs.core.envelope import WIDEST_SIGNING_TIME, Envelope, encode
from kumiko_jobs.core.exceptions import FALLBACK_MESSAGE_KEY, MESSAGE_KEY_MAX_LENGTH
from kumiko_jobs.definition.job import EscapeHatch
from kumiko_jobs.definition.options import MAX_DEFERS_LIMIT, build_definition
from kumiko_jobs.enqueueing.messages import message_for
from kumiko_jobs.enqueueing.validate import (
    GATE_DEFERS_HEADROOM,
    check_json,
    check_size,
    largest_reachable,
)
from kumiko_jobs.run.joblog import entry_size, log_entry

RUN_ID = "0123456789abcdef0123456789abcdef"
KEYS = conf_module.DEFAULT_SENSITIVE_KEYS


def a_job(ctx: Any, *, blob: str = "", tag: str = "") -> None:
    pass


def define(**options: Any) -> Any:
    return build_definition(a_job, {"name": "limits.a_job", **options})


# --- TenantVisibleError ---------------------------------------------------------------------


def test_a_message_key_at_the_column_size_is_kept() -> None:
    key = "k" * MESSAGE_KEY_MAX_LENGTH
    error = TenantVisibleError(key)
    assert (error.message_key, error.key_problem, str(error)) == (key, None, key)


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("k" * (MESSAGE_KEY_MAX_LENGTH + 1), "201 characters long, over 200"),
        ("k" * 500, "500 characters long"),
        ("", "non-empty string"),
        ("   ", "non-empty string"),
        ("bad\x00key", "NUL"),
        (None, "non-empty string"),
    ],
)
def test_an_unstorable_message_key_falls_back_and_says_why(key: Any, problem: str) -> None:
    error = TenantVisibleError(key)
    assert error.message_key == FALLBACK_MESSAGE_KEY
    assert problem in (error.key_problem or "")
    assert str(error).startswith("invalid TenantVisibleError:") and len(str(error)) < 400


# --- @job options ---------------------------------------------------------------------------


def test_retries_are_bounded_by_max_retries(settings: Any) -> None:
    assert define(retries=100).retries == 100
    with pytest.raises(InvalidJob, match=r"retries=101 is over KUMIKO_JOBS\['MAX_RETRIES'\]=100"):
        define(retries=101)
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "MAX_RETRIES": 3}
    assert define(retries=3).retries == 3
    with pytest.raises(InvalidJob, match="MAX_RETRIES"):
        define(retries=4)


def test_argument_depth_setting_stays_below_the_json_recursion_limit() -> None:
    assert conf_module._validate({"MAX_ARGUMENT_DEPTH": 500}).MAX_ARGUMENT_DEPTH == 500
    with pytest.raises(ImproperlyConfigured, match="MAX_ARGUMENT_DEPTH'] must be at most 500"):
        conf_module._validate({"MAX_ARGUMENT_DEPTH": 501})


def test_default_retries_cannot_exceed_max_retries() -> None:
    with pytest.raises(ImproperlyConfigured, match="DEFAULT_RETRIES"):
        conf_module._validate({"DEFAULT_RETRIES": 5, "MAX_RETRIES": 4})
    assert conf_module._validate({"DEFAULT_RETRIES": 4, "MAX_RETRIES": 4}).MAX_RETRIES == 4


def test_max_defers_is_bounded() -> None:
    assert define(max_defers=MAX_DEFERS_LIMIT).max_defers == MAX_DEFERS_LIMIT
    with pytest.raises(InvalidJob, match="max_defers=1000001 is over the upper bound"):
        define(max_defers=MAX_DEFERS_LIMIT + 1)


def test_queue_names_fit_the_history_column() -> None:
    assert define(queue="q" * 100).queue == "q" * 100
    with pytest.raises(InvalidJob, match="at most 100 characters"):
        define(queue="q" * 101)


def test_declared_failure_keys_fit_the_failure_column() -> None:
    key = "k" * MESSAGE_KEY_MAX_LENGTH
    assert define(tenant_visible_failure={"message_key": key}).tenant_visible_failure
    with pytest.raises(InvalidJob, match="201 characters long, over 200"):
        define(tenant_visible_failure={"message_key": key + "k"})


def test_escape_hatch_reasons_fit_the_audit_column() -> None:
    assert len(EscapeHatch(reason="r" * 500, grants=["unsafe_raw"]).reason) == 500
    with pytest.raises(InvalidJob, match="501 characters; keep it under 500"):
        EscapeHatch(reason="r" * 501, grants=["unsafe_raw"])


def test_job_names_are_bounded() -> None:
    assert define(name="n" * 200).name == "n" * 200
    with pytest.raises(InvalidJob, match="must match"):
        define(name="n" * 201)


@pytest.mark.parametrize(
    "key", ["MAX_RETRIES", "MAX_FOLLOWUPS_PER_RUN", "MAX_FANOUT_TENANTS", "LOG_LINE_BYTES"]
)
def test_new_limits_are_validated_settings(key: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=key):
        conf_module._validate({key: -1})
    with pytest.raises(ImproperlyConfigured, match=key):
        conf_module._validate({key: "10"})


# --- argument nesting -----------------------------------------------------------------------


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def test_arguments_nested_up_to_the_bound_pass() -> None:
    check_json({"blob": nested(32)}, "limits.a_job")
    check_json({"blob": json.loads("[" * 32 + "]" * 32)}, "limits.a_job")


@pytest.mark.parametrize("depth", [33, 5_000, 100_000])
def test_arguments_nested_past_the_bound_are_refused_not_a_recursion_error(depth: int) -> None:
    with pytest.raises(InvalidJob, match="nested more than MAX_ARGUMENT_DEPTH=32 levels"):
        check_json({"blob": nested(depth)}, "limits.a_job")
    with pytest.raises(InvalidJob, match="nested more than MAX_ARGUMENT_DEPTH=32 levels"):
        check_json({"blob": [nested(depth - 1)]}, "limits.a_job")


def test_a_list_that_contains_itself_is_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(InvalidJob, match="nested more than"):
        check_json({"blob": loop}, "limits.a_job")


def test_the_depth_bound_is_a_setting(settings: Any) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "MAX_ARGUMENT_DEPTH": 3}
    check_json({"blob": {"a": {"b": ["c"]}}}, "limits.a_job")
    with pytest.raises(InvalidJob, match="MAX_ARGUMENT_DEPTH=3"):
        check_json({"blob": {"a": {"b": [["c"]]}}}, "limits.a_job")


# --- message size at every reachable attempt ------------------------------------------------


def envelope(blob: str, **changes: Any) -> Envelope:
    values: dict[str, Any] = {
        "job": "limits.a_job",
        "schema": "t1",
        "kwargs": {"blob": blob},
        "run_id": RUN_ID,
    }
    return Envelope(**{**values, **changes})


def test_the_largest_reachable_envelope_has_the_last_counters() -> None:
    definition = define(retries=10, max_defers=20)
    largest = largest_reachable(definition, envelope("x"))
    assert (largest.attempt, largest.defers, largest.gate_defers) == (
        11,
        20,
        GATE_DEFERS_HEADROOM,
    )
    fanout = largest_reachable(define(per_tenant=True), envelope("x", schema=None))
    assert len(fanout.schema or "") == 63 and fanout.parent_run_id == RUN_ID
    assert fanout.trigger == "fanout"


def _widest(env: Envelope) -> str:
    return encode(env, now=WIDEST_SIGNING_TIME)


def _sized(definition: Any, target: int) -> Envelope:
    """An envelope whose largest reachable form is exactly ``target`` bytes."""
    env = envelope("")
    growth = len(_widest(largest_reachable(definition, env))) - len(_widest(env))
    return envelope("x" * (target - growth - len(_widest(env))))


def test_a_message_that_fits_at_its_last_attempt_is_accepted(settings: Any) -> None:
    definition = define(retries=10)
    limit = 4096
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "MAX_ENVELOPE_BYTES": limit}
    env = _sized(definition, limit)
    assert len(_widest(largest_reachable(definition, env))) == limit
    check_size(definition, env, message_for(definition, env, 0))


def test_a_message_that_outgrows_the_limit_at_a_later_attempt_is_refused(settings: Any) -> None:
    """Attempt 1 fits, with bytes to spare; attempt 11 (or a deferral) would be one byte over:
    every worker would reject it then, and the relay push it again forever."""
    definition = define(retries=10)
    limit = 4096
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "MAX_ENVELOPE_BYTES": limit}
    env = _sized(definition, limit + 1)
    message = message_for(definition, env, 0)
    assert len(message.body) < limit  # the check the previous code made passes
    with pytest.raises(InvalidJob, match=f"up to {limit + 1} bytes .*MAX_ENVELOPE_BYTES={limit}"):
        check_size(definition, env, message)


def test_a_fan_out_parent_is_sized_as_its_children(settings: Any) -> None:
    """The children carry a schema, the parent's id and a trigger the parent has not."""
    definition = define(per_tenant=True)
    limit = 4096
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "MAX_ENVELOPE_BYTES": limit}
    probe = envelope("", schema=None)
    base = len(_widest(probe))
    growth = len(_widest(largest_reachable(definition, probe))) - base
    assert growth > 90
    at = envelope("x" * (limit - base - growth), schema=None)
    check_size(definition, at, message_for(definition, at, 0))
    over = envelope("x" * (limit - base - growth + 1), schema=None)
    message = message_for(definition, over, 0)
    assert len(message.body) < limit - 90  # the parent itself fits easily
    with pytest.raises(InvalidJob, match="MAX_ENVELOPE_BYTES"):
        check_size(definition, over, message)


# --- ctx.log lines --------------------------------------------------------------------------


def test_log_fields_under_secret_keys_are_masked_whatever_their_type() -> None:
    entry = log_entry(
        logging.INFO,
        "charging with password=hunter2",
        {
            "password": b"hunter2",
            "api_key": ["k1", "k2"],
            "token": ("t1",),
            "Authorization": {"scheme": "Bearer"},
            "note": "url redis://:pw@cache/0",
            "invoice_id": 7,
        },
        KEYS,
        4096,
    )
    assert entry["msg"] == "charging with password=***"
    assert entry["data"] == {
        "password": "***",
        "api_key": "***",
        "token": "***",
        "Authorization": "***",
        "note": "url redis://:***@cache/0",
        "invoice_id": 7,
    }


def test_log_values_postgresql_cannot_store_are_made_storable() -> None:
    entry = log_entry(
        logging.INFO,
        "nul \x00 and \ud800",
        {"nan": float("nan"), "inf": float("inf"), "big": 10**30, "text": "a\x00b"},
        KEYS,
        4096,
    )
    assert entry["msg"] == "nul \\x00 and \\ud800"
    assert entry["data"] == {"nan": "nan", "inf": "inf", "big": str(10**30), "text": "a\\x00b"}
    json.dumps(entry, allow_nan=False).encode("utf-8")


def test_one_log_line_is_capped_in_bytes() -> None:
    line_bytes = 4096
    huge = log_entry(
        logging.INFO,
        "m " * 5_000_000,
        {f"field{i}": "v " * 10_000 for i in range(1000)},
        KEYS,
        line_bytes,
    )
    assert entry_size(huge) < line_bytes + 200
    assert huge["msg"].endswith("more characters]")
    fields = log_entry(logging.INFO, "ok", {f"f{i}": "v" * 100 for i in range(1000)}, KEYS, 4096)
    assert 0 < fields["data"]["…dropped_fields"] < 1000
    assert entry_size(fields) < line_bytes + 200


# --- subjects -------------------------------------------------------------------------------


def test_a_subject_at_the_column_size_is_kept_one_more_is_refused() -> None:
    from kumiko_jobs.definition.subject import build_subject

    definition = define(tenant_visible_run=["tag"])
    tag = "t" * (255 - len("tag="))
    assert build_subject(definition, {"tag": tag}) == f"tag={tag}"
    with pytest.raises(InvalidJob, match="256 characters, over 255"):
        build_subject(definition, {"tag": tag + "t"})
