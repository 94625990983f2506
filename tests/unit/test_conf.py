"""Unit tests for ``settings.KUMIKO_JOBS`` validation (core/conf.py): no database."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from kumiko_jobs.core import conf
from kumiko_jobs.core.conf import DEFAULT_SENSITIVE_KEYS, KumikoSettings, _validate

POSITIVE = ("DEFAULT_TIMEOUT", "MAX_ENVELOPE_BYTES", "LOG_LINES_PER_ATTEMPT")
NON_NEGATIVE = (
    "DEFAULT_RETRIES",
    "MAX_DEFERS",
    "RETENTION_DAYS",
    "RESULT_TTL",
    "FAILURE_TTL",
    "INACTIVE_TENANT_DEFER_SECONDS",
    "ESCAPE_HATCH_DEDUPE_SECONDS",
    "RUNNING_TIMEOUT_GRACE",
    "PUSH_FAILURE_PAUSE",
)


def refused(raw: Any, match: str) -> str:
    with pytest.raises(ImproperlyConfigured, match=match) as info:
        _validate(raw)
    return str(info.value)


# --- defaults ---------------------------------------------------------------------------------


def test_empty_settings_give_the_documented_defaults():
    settings = _validate({})
    assert settings == KumikoSettings()
    assert settings.DB_GUARD == "enforce"
    assert settings.DEFAULT_QUEUE == "default"
    assert (settings.DEFAULT_RETRIES, settings.DEFAULT_TIMEOUT, settings.MAX_DEFERS) == (0, 600, 20)
    assert settings.MAX_ENVELOPE_BYTES == 512 * 1024
    assert settings.INACTIVE_TENANT == "skip"
    assert settings.TENANT_ACTIVE_FIELD is None and settings.TENANT_CONCURRENCY is None
    assert settings.EXTRA_SHARED_TABLES == ()
    assert settings.SENSITIVE_KEYS == DEFAULT_SENSITIVE_KEYS
    assert settings.HISTORY_SYNCHRONOUS_COMMIT is True


def test_settings_are_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        _validate({}).DB_GUARD = "off"  # type: ignore[misc]


def test_every_known_key_can_be_set():
    raw = {
        "DB_GUARD": "log",
        "DEFAULT_QUEUE": "low",
        "DEFAULT_RETRIES": 3,
        "DEFAULT_TIMEOUT": 60,
        "MAX_DEFERS": 0,
        "RETENTION_DAYS": 0,
        "RESULT_TTL": 10,
        "FAILURE_TTL": 0,
        "TENANT_ACTIVE_FIELD": "is_active",
        "INACTIVE_TENANT": "defer",
        "INACTIVE_TENANT_DEFER_SECONDS": 0,
        "EXTRA_SHARED_TABLES": ["Legacy_Prices"],
        "OPERATOR_RECORD_TABLES": ["Api_Keys"],
        "SENSITIVE_KEYS": ("PIN", "otp"),
        "MAX_ENVELOPE_BYTES": 1,
        "ESCAPE_HATCH_DEDUPE_SECONDS": 0,
        "TENANT_CONCURRENCY": 1,
        "RUNNING_TIMEOUT_GRACE": 0,
        "LOG_LINES_PER_ATTEMPT": 1,
        "HOUSEKEEPING": False,
        "HISTORY_SYNCHRONOUS_COMMIT": False,
        "PUSH_FAILURE_PAUSE": 0,
        "TENANT_MEMBERSHIP": "kumiko_jobs.core.audience.django_tenant_users",
    }
    assert set(raw) <= {f.name for f in dataclasses.fields(KumikoSettings)}
    settings = _validate(raw)
    for key, value in raw.items():
        if key in ("EXTRA_SHARED_TABLES", "OPERATOR_RECORD_TABLES", "SENSITIVE_KEYS"):
            continue
        assert getattr(settings, key) == value, key
    # Table names and sensitive keys are compared lower-case, so they are stored that way.
    assert settings.EXTRA_SHARED_TABLES == ("legacy_prices",)
    assert settings.SENSITIVE_KEYS == ("pin", "otp")
    # The operators' records are relation names as PostgreSQL stores them: case kept.
    assert settings.OPERATOR_RECORD_TABLES == ("Api_Keys",)


# --- refused ----------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [None, [], "DB_GUARD=off", [("DB_GUARD", "off")], 5])
def test_not_a_dict(raw):
    refused(raw, "settings.KUMIKO_JOBS must be a dict")


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("DB_GAURD", "DB_GUARD"),
        ("db_guard", "DB_GUARD"),
        ("MAX_DEFER", "MAX_DEFERS"),
        ("DEFAULT_RETRY", "DEFAULT_RETRIES"),
        ("MAX_ENVELOPE_SIZE", "MAX_ENVELOPE_BYTES"),
    ],
)
def test_unknown_key_suggests_the_known_one(key, meant):
    message = refused({key: 1}, f"unknown key '{key}'. Did you mean '{meant}'\\?")
    assert (
        "Known keys: ADMIN_STATEMENT_TIMEOUT_MS, BOOT_GATE_TIMEOUT, BOOT_GATE_WARN_AFTER, "
        "CANCEL_GRACE, CRON_CATCH_UP, DB_GUARD, DB_POOLER," in message
    )


def test_unknown_key_without_a_close_match_lists_the_keys():
    message = refused({"ZZZ": 1}, "unknown key 'ZZZ'. Known keys: ")
    assert "Did you mean" not in message
    assert "MAX_ENVELOPE_BYTES" in message


def test_a_non_string_key_is_refused_not_a_crash():
    refused({5: "x"}, "unknown key 5")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("DB_GUARD", "strict"),
        ("DB_GUARD", "ENFORCE"),
        ("DB_GUARD", True),
        ("DB_GUARD", None),
        ("INACTIVE_TENANT", "pause"),
        ("INACTIVE_TENANT", ""),
    ],
)
def test_choices(key, value):
    message = refused({key: value}, f"settings.KUMIKO_JOBS\\['{key}'\\] is {value!r}; use one of")
    allowed = {"DB_GUARD": "('enforce', 'log', 'off')", "INACTIVE_TENANT": "('skip', 'defer')"}
    assert allowed[key] in message


@pytest.mark.parametrize(("key", "value"), [("DB_GUARD", v) for v in ("enforce", "log", "off")])
def test_each_choice_is_accepted(key, value):
    assert getattr(_validate({key: value}), key) == value


@pytest.mark.parametrize("key", POSITIVE + NON_NEGATIVE)
@pytest.mark.parametrize("value", [-1, True, False, 1.5, "10", None, [1]])
def test_integer_keys_refuse_other_values(key, value):
    minimum = 1 if key in POSITIVE else 0
    if value is False and minimum == 0:
        value = -5  # False is refused as a bool anyway; keep one case per key meaningful
    refused({key: value}, f"\\['{key}'\\] must be an integer >= {minimum}, got")


@pytest.mark.parametrize("key", POSITIVE)
def test_positive_keys_refuse_zero(key):
    refused({key: 0}, "must be an integer >= 1, got 0")


@pytest.mark.parametrize("key", NON_NEGATIVE)
def test_non_negative_keys_accept_zero(key):
    assert getattr(_validate({key: 0}), key) == 0


@pytest.mark.parametrize("value", ["", 5, None, ["default"]])
def test_default_queue_must_be_a_queue_name(value):
    refused({"DEFAULT_QUEUE": value}, r"\['DEFAULT_QUEUE'\] must be a queue name")


@pytest.mark.parametrize("key", ["HOUSEKEEPING", "HISTORY_SYNCHRONOUS_COMMIT"])
@pytest.mark.parametrize("value", [0, 1, "yes", "False", None])
def test_switches_must_be_true_or_false(key, value):
    refused({key: value}, f"'{key}'.* must be True or False")


@pytest.mark.parametrize("value", [5, True, ["is_active"]])
def test_tenant_active_field_must_be_a_name_or_none(value):
    refused({"TENANT_ACTIVE_FIELD": value}, "must be a field name or None")


def test_tenant_active_field_none_is_allowed():
    assert _validate({"TENANT_ACTIVE_FIELD": None}).TENANT_ACTIVE_FIELD is None


@pytest.mark.parametrize("value", [0, -1, True, "2", 1.0])
def test_tenant_concurrency_must_be_none_or_positive(value):
    refused({"TENANT_CONCURRENCY": value}, "must be None or an integer >= 1")


@pytest.mark.parametrize("key", ["EXTRA_SHARED_TABLES", "SENSITIVE_KEYS"])
@pytest.mark.parametrize("value", ["password", ["ok", 5], [None], 5, None, True, b"token"])
def test_string_lists_refuse_other_values(key, value):
    refused({key: value}, f"\\['{key}'\\] must be a list of strings")


def test_string_lists_refuse_a_generator_that_would_be_read_empty():
    refused({"SENSITIVE_KEYS": (k for k in ["pin"])}, "must be a list of strings")


def test_an_empty_string_list_is_allowed():
    settings = _validate({"SENSITIVE_KEYS": [], "EXTRA_SHARED_TABLES": ()})
    assert settings.SENSITIVE_KEYS == () and settings.EXTRA_SHARED_TABLES == ()


# --- get(): cached, and cleared when settings change ------------------------------------------


def test_get_reads_the_project_settings_once():
    assert conf.get() is conf.get()
    assert conf.get().DEFAULT_RETRIES == 0  # tests/settings.py


def test_get_follows_override_settings():
    before = conf.get()
    with override_settings(KUMIKO_JOBS={"MAX_DEFERS": 3, "DB_GUARD": "log"}):
        assert (conf.get().MAX_DEFERS, conf.get().DB_GUARD) == (3, "log")
    assert conf.get() == before and conf.get().MAX_DEFERS == 20


def test_get_raises_for_bad_settings_and_recovers():
    with (
        override_settings(KUMIKO_JOBS={"DB_GUARD": "maybe"}),
        pytest.raises(ImproperlyConfigured, match="'DB_GUARD'"),
    ):
        conf.get()
    assert conf.get().DB_GUARD == "enforce"


def test_missing_kumiko_jobs_setting_means_defaults(settings):
    del settings.KUMIKO_JOBS  # pytest-django sends no setting_changed for a deletion
    conf.get.cache_clear()
    try:
        assert conf.get() == KumikoSettings()
    finally:
        conf.get.cache_clear()


# --- GUARD_EXTRA_FUNCTIONS --------------------------------------------------------------------


def test_guard_extra_functions_are_folded_and_kept():
    settings = _validate({"GUARD_EXTRA_FUNCTIONS": ["unaccent", " Similarity ", "ext.ST_Distance"]})
    assert settings.GUARD_EXTRA_FUNCTIONS == ("unaccent", "similarity", "ext.st_distance")


@pytest.mark.parametrize(
    "value",
    ["unaccent", ["unaccent()"], ["a.b.c"], ["similarity(text, text)"], [""], [3], None],
)
def test_guard_extra_functions_refuse_what_is_not_a_function_name(value):
    message = refused({"GUARD_EXTRA_FUNCTIONS": value}, "GUARD_EXTRA_FUNCTIONS")
    assert "unaccent" in message  # names an example of what to write


@pytest.mark.parametrize(
    "value", ["", "is_member", 5, True, ["a.b"], "a..b", "a.b()", "a.b c", ".a.b", "a.b."]
)
def test_tenant_membership_must_be_a_dotted_path_or_none(value):
    """Only the shape is checked here (settings are read before apps load); whether the path
    imports and is callable is check E015's."""
    message = refused({"TENANT_MEMBERSHIP": value}, "TENANT_MEMBERSHIP")
    assert "kumiko_jobs.core.audience.django_tenant_users" in message  # the fix, named


def test_tenant_membership_none_is_the_default():
    assert _validate({}).TENANT_MEMBERSHIP is None
    assert _validate({"TENANT_MEMBERSHIP": None}).TENANT_MEMBERSHIP is None


def test_fairness_and_tenant_weight():
    assert _validate({}).FAIRNESS == "tenant" and _validate({}).TENANT_WEIGHT is None
    assert _validate({"FAIRNESS": "fifo"}).FAIRNESS == "fifo"
    refused({"FAIRNESS": "round-robin"}, "FAIRNESS")
    assert _validate({"TENANT_WEIGHT": "plans.weight"}).TENANT_WEIGHT == "plans.weight"
    for bad in ("weight", 2, ["plans.weight"]):
        refused({"TENANT_WEIGHT": bad}, "must be the dotted path of a callable")
