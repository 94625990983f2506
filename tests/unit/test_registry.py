"""Unit tests for ``@job`` option validation, the registry and backoff: no database, no Redis.

Definitions go into fresh ``Registry()`` instances (or through ``build_definition``), never the
project's frozen registry.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any

import pytest

from kumiko_jobs import InvalidJob, JobNotRegistered
from kumiko_jobs.definition import registry as registry_module
from kumiko_jobs.definition.job import (
    GRANTS,
    Backoff,
    EscapeHatch,
    FailureVisibility,
    JobDefinition,
)
from kumiko_jobs.definition.options import build_definition
from kumiko_jobs.definition.registry import Registry
from kumiko_jobs.enqueueing import api


def sync_invoice(ctx: Any, *, invoice_id: int, force: bool = False) -> None:
    """Push one invoice to the provider.

    Second paragraph: not part of the description.
    """


def other_sync_invoice(ctx: Any, *, invoice_id: int) -> None:
    pass


def define(func: Any = sync_invoice, **options: Any) -> JobDefinition:
    return build_definition(func, options)


def refused(match: str, func: Any = sync_invoice, **options: Any) -> str:
    """The message of the InvalidJob that ``options`` raise; it must name the fix."""
    with pytest.raises(InvalidJob, match=match) as info:
        define(func, **options)
    message = str(info.value)
    assert message.startswith(f"@job on {getattr(func, '__qualname__', func)}:"), message
    return message


# --- the allowed path -------------------------------------------------------------------------


def test_defaults():
    definition = define(name="billing.sync_invoice")
    assert definition.name == "billing.sync_invoice"
    assert definition.func is sync_invoice
    assert (definition.queue, definition.retries, definition.timeout) == (None, None, None)
    assert definition.backoff == Backoff("exponential", 1.0, 3600.0)
    assert definition.tenant_visible_run == ()
    assert definition.tenant_visible_failure is None
    assert definition.escape_hatch is None and definition.grants == ()
    assert (definition.system, definition.manual, definition.max_defers) == (False, False, None)
    assert definition.description == "Push one invoice to the provider."


def test_every_issue_2_option_is_taken():
    hatch = EscapeHatch(reason="reads the shared price list", grants=["cross_tenant_reads"])
    definition = define(
        name="billing.custom",
        queue="low",
        retries=3,
        backoff={"type": "fixed", "delay": 5, "max_delay": 10},
        timeout=30,
        tenant_visible_run=["invoice_id"],
        tenant_visible_failure={"message_key": "billing.failed", "subject_fields": ["force"]},
        escape_hatch=hatch,
        manual=True,
        max_defers=0,
        description="Overrides the docstring.",
    )
    assert definition.name == "billing.custom"
    assert (definition.queue, definition.retries, definition.timeout) == ("low", 3, 30)
    assert definition.backoff == Backoff("fixed", 5.0, 10.0)
    assert definition.tenant_visible_run == ("invoice_id",)
    assert definition.tenant_visible_failure == FailureVisibility("billing.failed", ("force",))
    assert definition.escape_hatch is hatch
    assert definition.grants == ("cross_tenant_reads",)
    assert definition.manual is True and definition.max_defers == 0
    assert definition.description == "Overrides the docstring."
    assert definition.subject_fields == ("invoice_id", "force")


def test_subject_fields_merge_run_and_failure_fields_without_duplicates():
    definition = define(
        tenant_visible_run=["invoice_id"],
        tenant_visible_failure={"message_key": "k", "subject_fields": ["force", "invoice_id"]},
    )
    assert definition.subject_fields == ("invoice_id", "force")


def test_system_job():
    definition = define(system=True)
    assert definition.system is True


def test_a_backoff_instance_is_taken_as_is():
    backoff = Backoff("fixed", 2.5)
    assert define(backoff=backoff).backoff is backoff


def test_bare_and_called_decorator_register_in_the_registry(monkeypatch):
    fresh = Registry()
    monkeypatch.setattr(api, "registry", fresh)

    @api.job
    def bare(ctx: Any) -> None:
        pass

    @api.job(name="tests.called", retries=1)
    def called(ctx: Any, *, x: int) -> None:
        pass

    assert isinstance(bare, JobDefinition) and isinstance(called, JobDefinition)
    assert [d.name for d in fresh] == [bare.name, "tests.called"]
    assert fresh.get("tests.called") is called and called.retries == 1


def test_calling_a_definition_calls_the_function_directly():
    seen: list[tuple[Any, dict[str, Any]]] = []

    def record(ctx: Any, **kwargs: Any) -> str:
        seen.append((ctx, kwargs))
        return "done"

    assert define(record)("ctx", a=1) == "done"
    assert seen == [("ctx", {"a": 1})]


# --- default names ----------------------------------------------------------------------------


def _function_in(module: str, name: str = "nightly") -> Any:
    def func(ctx: Any) -> None:
        pass

    func.__module__ = module
    func.__name__ = func.__qualname__ = name
    return func


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("tests.testapp.jobs", "testapp.nightly"),  # app label, not the dotted path
        ("example_project.billing.jobs", "billing.nightly"),
        ("example_project.billing.tasks.reports", "billing.nightly"),  # deeper in the app
        ("example_project.customers.jobs", "customers.nightly"),
        ("kumiko_jobs.sweep", "kumiko_jobs.nightly"),
        ("not_an_app.pkg.jobs", "pkg.nightly"),  # outside any app: the package name
    ],
)
def test_default_name_is_app_label_dot_function(module, expected):
    assert define(_function_in(module)).name == expected


def test_explicit_name_wins_over_the_default():
    assert define(_function_in("tests.testapp.jobs"), name="reports.nightly").name == (
        "reports.nightly"
    )


# --- every option validated, naming the fix ---------------------------------------------------


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("retires", "retries"),
        ("retry", "retries"),
        ("queu", "queue"),
        ("tenant_visible_runs", "tenant_visible_run"),
        ("escapehatch", "escape_hatch"),
        ("max_defer", "max_defers"),
        ("timout", "timeout"),
    ],
)
def test_unknown_option_suggests_the_known_one(typo, meant):
    message = refused(f"unknown option '{typo}' \\(did you mean '{meant}'\\?\\)", **{typo: 1})
    assert "Options: [" in message and "'retries'" in message


def test_unknown_option_without_a_close_match_lists_the_options():
    message = refused("unknown option 'zzzzzz'", zzzzzz=1)
    assert "did you mean" not in message
    assert "'backoff'" in message and "'tenant_visible_run'" in message


def test_several_unknown_options_are_named_together():
    message = refused("unknown option", retires=1, queu="x")
    assert "'queu' (did you mean 'queue'?)" in message
    assert "'retires' (did you mean 'retries'?)" in message


@pytest.mark.parametrize(
    "name",
    [
        5,
        "has space",
        "1starts.with.digit",
        "semi;colon",
        "x" * 201,
        ".leading.dot",
        ["a.b"],
        "a.b\n",
    ],
)
def test_bad_names_are_refused(name):
    refused(r"name=.* must match", name=name)


@pytest.mark.parametrize("name", ["a", "billing.sync_invoice", "ns:job-1", "A_b.c", "x" * 200])
def test_good_names_are_accepted(name):
    assert define(name=name).name == name


@pytest.mark.parametrize("queue", ["", 5, ["default"], False])
def test_bad_queue_is_refused(queue):
    refused("queue must be the name of an RQ_QUEUES entry", queue=queue)


@pytest.mark.parametrize(
    ("option", "minimum", "bad"),
    [
        ("retries", 0, -1),
        ("retries", 0, True),
        ("retries", 0, 1.0),
        ("retries", 0, "3"),
        ("timeout", 1, 0),
        ("timeout", 1, -30),
        ("timeout", 1, False),
        ("timeout", 1, 2.5),
        ("max_defers", 0, -1),
        ("max_defers", 0, "10"),
    ],
)
def test_bad_integers_are_refused(option, minimum, bad):
    message = refused(f"{option} must be an integer >= {minimum}", **{option: bad})
    assert repr(bad) in message


@pytest.mark.parametrize(("option", "value"), [("retries", 0), ("timeout", 1), ("max_defers", 0)])
def test_integer_minimums_are_allowed(option, value):
    assert getattr(define(**{option: value}), option) == value


@pytest.mark.parametrize("flag", ["system", "manual", "tenant_operable"])
@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_flags_must_be_bool(flag, value):
    refused(f"{flag} must be True or False, got {value!r}", **{flag: value})


def test_tenant_operable_is_true_unless_declared_false():
    """Today's behaviour by default: a tenant's members holding operate_tenant_runs act on the
    job's runs; ``False`` leaves them to the operators (admin/tenant_acts.py)."""
    assert define().tenant_operable is True
    assert define(tenant_operable=True).tenant_operable is True
    assert define(tenant_operable=False).tenant_operable is False
    assert define(tenant_operable=False, cron="0 3 * * *", per_tenant=True).tenant_operable is False


def test_tenant_operable_false_is_refused_for_a_system_job():
    """A system job's runs belong to no tenant: the option would promise a protection that
    nothing needs. The message says to drop it."""
    message = refused("a system job's runs belong to no tenant", system=True, tenant_operable=False)
    assert "Drop the option" in message
    assert define(system=True, tenant_operable=True).tenant_operable is True


@pytest.mark.parametrize(
    "backoff",
    [
        "linear",
        "Exponential",
        "",
        None,
        5,
        {"type": "linear"},
        {"delay": -1},
        {"delay": True},
        {"delay": "1"},
        {"max_delay": -1},
        {"type": "fixed", "delay": 1, "jitter": 0.5},
        ["fixed", 1],
    ],
)
def test_bad_backoff_forms_are_refused(backoff):
    message = refused("backoff=.* is not valid", backoff=backoff)
    assert "use 'fixed', 'exponential' or" in message and "'delay': seconds >= 0" in message


@pytest.mark.parametrize(
    ("backoff", "expected"),
    [
        ("fixed", Backoff("fixed", 1.0, 3600.0)),
        ("exponential", Backoff("exponential", 1.0, 3600.0)),
        ({"type": "fixed", "delay": 0}, Backoff("fixed", 0.0, 3600.0)),
        ({"delay": 2}, Backoff("exponential", 2.0, 3600.0)),
        ({"type": "exponential", "delay": 0.5, "max_delay": 4}, Backoff("exponential", 0.5, 4.0)),
        ({}, Backoff("exponential", 1.0, 3600.0)),
    ],
)
def test_good_backoff_forms(backoff, expected):
    parsed = define(backoff=backoff).backoff
    assert parsed == expected
    assert isinstance(parsed.delay, float) and isinstance(parsed.max_delay, float)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("invoice_id", "must be a list of argument names, got 'invoice_id'"),
        (5, "must be a list of argument names"),
        (["invoice"], r"names \['invoice'\], which are not keyword arguments"),
        (["ctx"], r"names \['ctx'\]"),  # the context is not an argument
        (["invoice_id", "nope"], r"names \['nope'\]"),
        ([1], r"names \[1\]"),
    ],
)
def test_tenant_visible_run_must_name_arguments(value, match):
    message = refused(match, tenant_visible_run=value)
    if "which are not" in message:
        assert "(it has ['invoice_id', 'force'])" in message


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("billing.failed", "tenant_visible_failure must be"),
        (["billing.failed"], "tenant_visible_failure must be"),
        ({"message_key": "k", "fields": ["invoice_id"]}, "tenant_visible_failure must be"),
        ({"subject_fields": ["invoice_id"]}, "needs a message_key"),
        ({"message_key": ""}, "needs a message_key"),
        ({"message_key": "   "}, "needs a message_key"),
        ({"message_key": 5}, "needs a message_key"),
        ({"message_key": "k", "subject_fields": ["nope"]}, r"names \['nope'\]"),
        ({"message_key": "k", "subject_fields": "invoice_id"}, "must be a list of argument"),
    ],
)
def test_tenant_visible_failure_is_validated(value, match):
    refused(match, tenant_visible_failure=value)


@pytest.mark.parametrize(
    "visible",
    [
        {"tenant_visible_run": ["invoice_id"]},
        {"tenant_visible_failure": {"message_key": "billing.failed"}},
    ],
)
def test_system_jobs_take_no_tenant_visible_fields(visible):
    refused(
        "system jobs run for no tenant; drop tenant_visible_run/_failure", system=True, **visible
    )
    assert define(system=False, **visible).system is False


@pytest.mark.parametrize(
    "hatch", ["global_writes", {"reason": "x", "grants": ["global_writes"]}, ["global_writes"]]
)
def test_escape_hatch_must_be_an_escape_hatch(hatch):
    refused(r"escape_hatch must be EscapeHatch\(reason=..., grants=\[...\]\)", escape_hatch=hatch)


def _no_args() -> None:
    pass


def _keyword_only(*, invoice_id: int) -> None:
    pass


def _var_args(*args: Any, **kwargs: Any) -> None:
    pass


@pytest.mark.parametrize("func", [_no_args, _keyword_only, _var_args])
def test_a_function_without_a_context_parameter_is_refused(func):
    message = refused("must take the context as first argument", func)
    assert "def job(ctx, *, ...)" in message


def test_a_non_function_is_refused():
    with pytest.raises(InvalidJob, match="@job decorates a function, got 42"):
        build_definition(42, {})  # type: ignore[arg-type]


# --- bind_arguments ---------------------------------------------------------------------------


def test_bind_arguments_accepts_what_the_signature_takes():
    definition = define(name="billing.sync_invoice")
    definition.bind_arguments({"invoice_id": 7})
    definition.bind_arguments({"invoice_id": 7, "force": True})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "missing a required keyword-only argument: 'invoice_id'"),
        ({"invoice_id": 7, "forse": True}, "unexpected keyword argument 'forse'"),
        ({"invoice_id": 7, "ctx": 1}, "multiple values for argument 'ctx'"),
        # A misspelt name: both the unknown and the missing one (bind() named the missing only).
        (
            {"invoce_id": 7},
            r"unexpected keyword argument 'invoce_id', missing 'invoice_id' "
            r"\(it takes force, invoice_id\)",
        ),
        ({"a": 1, "b": 2, "invoice_id": 7}, "unexpected keyword arguments 'a', 'b' \\(it takes"),
    ],
)
def test_bind_arguments_refuses_what_it_does_not(kwargs, match):
    definition = define(name="billing.sync_invoice")
    with pytest.raises(InvalidJob, match=match) as info:
        definition.bind_arguments(kwargs)
    assert str(info.value).startswith("Job 'billing.sync_invoice': ")
    assert str(info.value).endswith("Pass the job's keyword arguments.")


# --- EscapeHatch ------------------------------------------------------------------------------


def test_escape_hatch_keeps_a_stripped_reason_and_unique_grants_in_order():
    hatch = EscapeHatch(
        reason="  rebuilds the shared price index ",
        grants=["global_writes", "unsafe_raw", "global_writes"],
    )
    assert hatch.reason == "rebuilds the shared price index"
    assert hatch.grants == ("global_writes", "unsafe_raw")


@pytest.mark.parametrize("grant", GRANTS)
def test_each_grant_is_accepted(grant):
    assert EscapeHatch(reason="why", grants=(grant,)).grants == (grant,)


@pytest.mark.parametrize("reason", ["", "   ", None, 5])
def test_escape_hatch_needs_a_reason(reason):
    with pytest.raises(InvalidJob, match="EscapeHatch needs a reason"):
        EscapeHatch(reason=reason, grants=["global_writes"])


@pytest.mark.parametrize("grants", ["global_writes", [], ()])
def test_escape_hatch_needs_a_list_of_grants(grants):
    with pytest.raises(InvalidJob, match=r"must be a non-empty list of grants"):
        EscapeHatch(reason="why", grants=grants)


@pytest.mark.parametrize("grants", [["global_write"], ["global_writes", "sudo"], ["UNSAFE_RAW"]])
def test_escape_hatch_refuses_unknown_grants(grants):
    with pytest.raises(InvalidJob, match="unknown grant") as info:
        EscapeHatch(reason="why", grants=grants)
    assert "use grants from" in str(info.value)


def test_escape_hatch_is_immutable():
    hatch = EscapeHatch(reason="why", grants=["unsafe_raw"])
    with pytest.raises(AttributeError):
        hatch.reason = "other"  # type: ignore[misc]


# --- Backoff arithmetic -----------------------------------------------------------------------


def test_fixed_backoff_is_constant():
    backoff = Backoff("fixed", 5.0)
    assert [backoff.seconds_after(n) for n in (1, 2, 3, 10, 100)] == [5.0] * 5


def test_exponential_backoff_doubles_from_one_second():
    backoff = Backoff()
    assert [backoff.seconds_after(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]


def test_exponential_backoff_scales_with_its_delay():
    assert [Backoff("exponential", 0.5).seconds_after(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert [Backoff("exponential", 0.0).seconds_after(n) for n in (1, 5)] == [0.0, 0.0]


def test_exponential_backoff_is_capped():
    backoff = Backoff("exponential", 1.0, max_delay=10.0)
    assert [backoff.seconds_after(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert Backoff().seconds_after(13) == 3600.0  # 4096 s, capped at the default hour
    assert Backoff().seconds_after(10_000) == 3600.0  # no overflow on absurd attempt numbers


# --- Registry ---------------------------------------------------------------------------------


def test_registry_finds_jobs_by_name():
    fresh = Registry()
    definition = fresh.register(define(name="billing.sync_invoice"))
    assert fresh.get("billing.sync_invoice") is definition
    assert "billing.sync_invoice" in fresh and "billing.other" not in fresh
    assert len(fresh) == 1 and list(fresh) == [definition]


def test_unknown_names_raise_job_not_registered_with_the_known_names():
    fresh = Registry()
    fresh.register(define(name="billing.sync_invoice"))
    with pytest.raises(JobNotRegistered, match=r"No job named 'billing.sync'") as info:
        fresh.get("billing.sync")
    assert "['billing.sync_invoice']" in str(info.value)


def test_iteration_is_sorted_by_name():
    fresh = Registry()
    for name in ("b.two", "a.one", "c.three"):
        fresh.register(define(name=name))
    assert [d.name for d in fresh] == ["a.one", "b.two", "c.three"]


def test_two_functions_with_one_name_are_refused():
    fresh = Registry()
    fresh.register(define(sync_invoice, name="billing.sync"))
    with pytest.raises(InvalidJob, match=r"Two jobs are named 'billing\.sync'") as info:
        fresh.register(define(other_sync_invoice, name="billing.sync"))
    message = str(info.value)
    assert f"{__name__}.sync_invoice and {__name__}.other_sync_invoice" in message
    assert "Give one of them @job(name='...')" in message
    assert fresh.get("billing.sync").func is sync_invoice


def test_the_same_function_registered_again_replaces_itself():
    # A module imported twice (autoreload, a test re-import) is not a duplicate.
    fresh = Registry()
    first = fresh.register(define(sync_invoice, name="billing.sync"))
    second = fresh.register(define(sync_invoice, name="billing.sync", retries=2))
    assert fresh.get("billing.sync") is second is not first
    assert len(fresh) == 1


def test_a_frozen_registry_refuses_late_jobs():
    fresh = Registry()
    fresh.register(define(sync_invoice, name="billing.sync"))
    fresh.freeze()
    with pytest.raises(InvalidJob, match="declared after start-up") as info:
        fresh.register(define(other_sync_invoice, name="billing.late"))
    assert "installed app's jobs.py" in str(info.value)
    assert "billing.late" not in fresh
    # A re-import of a job it already knows is still fine; a clash is still a clash.
    fresh.register(define(sync_invoice, name="billing.sync"))
    with pytest.raises(InvalidJob, match="Two jobs are named"):
        fresh.register(define(other_sync_invoice, name="billing.sync"))


def test_the_project_registry_is_frozen_after_start_up():
    with pytest.raises(InvalidJob, match="declared after start-up"):
        api.job(name="tests.too_late")(other_sync_invoice)
    assert "tests.too_late" not in registry_module.registry


def test_the_project_registry_holds_the_test_jobs_by_app_label():
    from kumiko_jobs import task_jobs

    names = {d.name for d in registry_module.registry}
    assert {"testapp.probe", "testapp.flaky", "testapp.system_tick"} <= names
    # Django tasks are the exception: their jobs are named by the task's module path.
    jobs = {name for name in names if task_jobs.task_job(name) is None}
    assert not any(re.match(r"tests\.", name) for name in jobs)
    if importlib.util.find_spec("django.tasks") is not None:  # Django 6: the task framework
        assert "tests.testapp.tasks.add" in names - jobs


# --- atomic=True ------------------------------------------------------------------------------


def test_atomic_is_off_by_default_and_taken_with_retries_and_unsafe_raw():
    assert define().atomic is False
    hatch = EscapeHatch(reason="vacuum hint", grants=["unsafe_raw", "system_identity"])
    definition = define(atomic=True, retries=3, escape_hatch=hatch)
    assert definition.atomic is True and definition.retries == 3


async def async_job(ctx: Any) -> None:
    pass


@pytest.mark.parametrize(
    ("options", "func", "match"),
    [
        ({"system": True}, sync_invoice, "atomic=True is for tenant jobs"),
        ({"per_tenant": True}, sync_invoice, "cannot be combined with per_tenant"),
        ({}, async_job, "needs a synchronous body"),
        (
            {"escape_hatch": EscapeHatch(reason="r", grants=["global_writes"])},
            sync_invoice,
            r"grant\(s\) \['global_writes'\]",
        ),
        (
            {"escape_hatch": EscapeHatch(reason="r", grants=["cross_tenant_reads"])},
            sync_invoice,
            r"grant\(s\) \['cross_tenant_reads'\]",
        ),
    ],
)
def test_atomic_combinations_that_cannot_be_one_transaction_are_refused(options, func, match):
    message = refused(match, func, atomic=True, **options)
    assert "atomic=True" in message
    define(func, **options)  # calibration: the same options without atomic=True are fine


def test_atomic_must_be_a_bool():
    refused("atomic must be True or False", atomic="yes")


def test_override_declares_for_a_block_even_once_frozen_and_restores_the_registry() -> None:
    reg = Registry()
    original = build_definition(sync_invoice, {"name": "billing.sync"})
    reg.register(original)
    reg.freeze()
    replacement = build_definition(sync_invoice, {"name": "billing.sync", "retries": 1})
    extra = build_definition(sync_invoice, {"name": "billing.extra"})
    with reg.override(replacement, extra):
        assert reg.get("billing.sync") is replacement
        assert reg.get("billing.extra") is extra
    assert reg.get("billing.sync") is original
    assert "billing.extra" not in reg
    # Outside override, the freeze still refuses a late job.
    with pytest.raises(InvalidJob, match="declared after start-up"):
        reg.register(extra)


def test_unique_options_are_checked_at_registration():
    def body(ctx, *, invoice_id: int) -> None: ...

    cases = {
        "names ['nope'], which are not keyword arguments": {"unique": ["nope"]},
        "unique=[] names no argument": {"unique": []},
        "unique_for= needs unique=": {"unique_for": 60},
        "unique_for must be seconds > 0": {"unique": True, "unique_for": 0},
        "Choose one of the two": {"unique": True, "concurrency": "replace"},
    }
    for expected, options in cases.items():
        with pytest.raises(InvalidJob, match=re.escape(expected)):
            build_definition(body, options)
    assert build_definition(body, {"unique": True}).unique == ("invoice_id",)
