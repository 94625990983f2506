"""Rate limits by time window, the pure parts: the parser, registration, the settings, the
windows a message carries, and the sliding-window rule the dequeue script applies."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from kumiko_jobs import InvalidJob
from kumiko_jobs.core import conf as conf_module
from kumiko_jobs.core.envelope import Envelope
from kumiko_jobs.core.rates import Rate, parse_rate
from kumiko_jobs.definition.options import build_definition
from kumiko_jobs.enqueueing.messages import message_for, rates_of
from kumiko_jobs.transport.fair_policy import window_reopens
from kumiko_jobs.transport.fair_rates import READABLE_VALUE_MAX, value_window

RUN_ID = "0123456789abcdef0123456789abcdef"


def a_job(ctx: Any, *, account: str = "", tag: str = "") -> None:
    pass


def define(**options: Any) -> Any:
    return build_definition(a_job, {"name": "rates.a_job", **options})


def envelope(schema: str | None = "t1", **kwargs: Any) -> Envelope:
    return Envelope(job="rates.a_job", schema=schema, kwargs=kwargs, run_id=RUN_ID)


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("100/m", Rate(100, 60)),
        ("5/s", Rate(5, 1)),
        ("5000/h", Rate(5000, 3600)),
        (" 10 / s ", Rate(10, 1)),
    ],
)
def test_rates_parse(text: str, rate: Rate) -> None:
    assert parse_rate(text) == rate
    assert str(rate) in text.replace(" ", "")


@pytest.mark.parametrize("bad", ["100/min", "0/m", "-1/s", "abc", "1.5/s", "10", 10, None, "/m"])
def test_registration_refuses_a_bad_rate_and_names_the_fix(bad: Any) -> None:
    for option in ("rate_limit", "tenant_rate_limit"):
        if bad is None:
            assert getattr(define(**{option: bad}), option) is None  # None: no limit
            continue
        with pytest.raises(InvalidJob, match=rf"{option}: .*'<starts>/<unit>'.*e\.g\. '100/m'"):
            define(**{option: bad})


def test_rate_limit_by_names_an_argument_and_needs_a_rate() -> None:
    assert define(rate_limit="10/s", rate_limit_by="account").rate_limit_by == "account"
    with pytest.raises(InvalidJob, match="needs rate_limit="):
        define(rate_limit_by="account")
    with pytest.raises(InvalidJob, match=r"rate_limit_by='nope' must name a keyword argument"):
        define(rate_limit="10/s", rate_limit_by="nope")


def test_the_tenant_rate_limit_setting_is_validated() -> None:
    parsed = conf_module._validate({"TENANT_RATE_LIMIT": "30/m"})
    assert str(parsed.TENANT_RATE_LIMIT) == "30/m"
    assert conf_module._validate({}).TENANT_RATE_LIMIT is None
    for bad in ("30/min", "0/s", 5):
        with pytest.raises(ImproperlyConfigured, match=r"TENANT_RATE_LIMIT'\]: .*'100/m'"):
            conf_module._validate({"TENANT_RATE_LIMIT": bad})


def test_a_message_carries_its_windows(settings: Any) -> None:
    definition = define(rate_limit="100/m", tenant_rate_limit="10/s", rate_limit_by="account")
    assert rates_of(definition, envelope(account="acc-1")) == (
        ('j:rates.a_job:k:"acc-1"', 100, 60),
        ("jt:rates.a_job\tt1", 10, 1),
    )
    # per tenant: another tenant's window is another key
    assert rates_of(definition, envelope("t2", account="acc-1"))[1][0] == "jt:rates.a_job\tt2"
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TENANT_RATE_LIMIT": "30/h"}
    assert rates_of(define(), envelope()) == (("t:t1", 30, 3600),)
    assert rates_of(define(), envelope(schema=None)) == ()  # system runs are no tenant's
    meta = message_for(definition, envelope(account="a"), 0).meta
    assert meta is not None and meta["kumiko_fair"][4][1] == ["jt:rates.a_job\tt1", 10, 1]
    # without limits the fair field is as before (messages queued earlier read the same)
    plain = message_for(define(), envelope(), 0).meta
    assert plain is not None and len(plain["kumiko_fair"]) == 5  # TENANT_RATE_LIMIT is set
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TENANT_RATE_LIMIT": None}
    plain = message_for(define(), envelope(), 0).meta
    assert plain is not None and len(plain["kumiko_fair"]) == 4


def test_a_sliding_window_admits_limit_starts_per_period() -> None:
    assert window_reopens([], 2, 1.0, now=10.0) is None
    assert window_reopens([9.5], 2, 1.0, now=10.0) is None
    assert window_reopens([9.5, 9.8], 2, 1.0, now=10.0) == 10.5  # full: the oldest leaves
    assert window_reopens([9.5, 9.8], 2, 1.0, now=10.5) is None  # (now - per, now]: it left
    assert window_reopens([9.0, 9.5, 9.8], 2, 1.0, now=9.9) == 10.5  # 9.0 already out


def test_admitting_by_the_window_never_exceeds_the_limit_and_uses_it() -> None:
    """Simulated backlog: start whenever the window admits, else at its reopening; every
    window of ``per`` holds at most ``limit`` starts, and the backlog drains at the limit."""
    limit, per, now, starts = 5, 1.0, 0.0, []
    while len(starts) < 50:
        reopen = window_reopens(starts, limit, per, now)
        if reopen is None:
            starts.append(now)
            now += 0.01
        else:
            now = reopen
    for t in starts:
        assert sum(1 for s in starts if t <= s < t + per) <= limit
    assert starts[-1] - starts[0] < (50 / limit) * per  # 10 windows for 50 starts, no more


def test_no_argument_value_or_schema_name_reaches_another_window(settings: Any) -> None:
    """Attack: a tenant chooses the ``rate_limit_by`` value (":", "{", "}", a tab, JSON
    look-alikes, other types, a long text) or its schema name (django-tenants accepts a tab,
    "!system"): no choice makes its window key another job's, another value's, another
    tenant's, or the tenant-wide one."""
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TENANT_RATE_LIMIT": "30/h"}
    definition = define(rate_limit="100/m", tenant_rate_limit="10/s", rate_limit_by="account")
    values: list[Any] = [
        "a",
        "a:k:b",
        '"a"',
        "{a}",
        "a\tt2",
        "t:t2",
        5,
        "5",
        5.5,
        True,
        None,
        ["a"],
        "x" * 5000,
    ]
    schemas = ["t1", "t2", "t1\tt2", "!system", "~other", "=7431", None]
    windows: dict[str, tuple[str, Any]] = {}
    for schema in schemas:
        for value in values:
            for key, _, _ in rates_of(definition, envelope(schema, account=value)):
                owner = ("", repr(value)) if key.startswith("j:") else (str(schema), "")
                assert windows.setdefault(key, owner) == owner, key  # one owner per window
    plain = rates_of(define(rate_limit="1/s"), envelope("t1"))[0][0]
    assert plain == "j:rates.a_job" and plain not in windows  # the job's window without _by


def test_a_rate_limit_by_value_window_is_short_and_its_own() -> None:
    """``value_window``: a short value stays readable as it was; a long one becomes a
    fixed-size hashed key. Distinct values,
    long or short, never share a key, and no hashed key is a short one's (the marker differs:
    a value whose JSON reads like a hash stays in ``:k:``). Proven able to fail: with the JSON
    in the key (the code before) a 500 KB value makes a 500 KB key."""
    assert value_window("rates.a_job", "acc-1") == 'j:rates.a_job:k:"acc-1"'
    assert value_window("rates.a_job", {"b": 1, "a": [2]}) == 'j:rates.a_job:k:{"a": [2], "b": 1}'
    long = "x" * 500_000
    hashed = value_window("rates.a_job", long)
    assert hashed.startswith("j:rates.a_job:h:") and len(hashed) == len("j:rates.a_job:h:") + 64
    values: list[Any] = [
        long,
        long[:-1] + "y",
        "x" * 100,
        "x" * 98,  # JSON of 100 characters: the longest kept readable
        "x" * 99,  # 101: hashed
        "a\x7fb",
        "a\tb",
        "é",
        hashed,
        hashed.rsplit(":", 1)[1],  # a value that looks like a hash stays a readable value
        5,
        "5",
        None,
        [long],
    ]
    keys = [value_window("rates.a_job", v) for v in values]
    assert len(set(keys)) == len(values), keys  # one window per value
    assert all(len(k) <= len("j:rates.a_job:k:") + READABLE_VALUE_MAX for k in keys)
    assert value_window("rates.a_job", "x" * 98).split(":")[2] == "k"
    assert value_window("rates.a_job", "x" * 99).split(":")[2] == "h"
    # control characters, DEL and non-ASCII are escaped by the JSON: printable, readable
    assert value_window("rates.a_job", "a\tb\x7f") == 'j:rates.a_job:k:"a\\tb\\u007f"'
    # the same value is the same window, at every push
    assert value_window("rates.a_job", [long]) == value_window("rates.a_job", [long])
    definition = define(rate_limit="100/m", rate_limit_by="account")
    assert rates_of(definition, envelope(account=long))[0][0] == hashed


def test_a_job_name_with_a_colon_shares_no_window_with_another_job_s_values() -> None:
    """A job name may contain ":" (task jobs' ``<path>:<queue>``), the separator of a value
    window's parts: job ``rates.a``'s window of the value 1 was ``j:rates.a:k:1``, the plain
    window of a job named ``rates.a:k:1``, and its value window of "a" job ``rates.a:h:...``'s
    as well. Each window now has one owner. Proven able to fail: with the plain key
    ``j:<name>`` as it was, the first two were one window."""
    long = "x" * 200
    job_a = build_definition(
        a_job, {"name": "rates.a", "rate_limit": "1/s", "rate_limit_by": "account"}
    )
    windows: dict[str, str] = {}
    for value in (1, True, None, long):
        [(key, _, _)] = rates_of(
            job_a, Envelope(job="rates.a", schema=None, kwargs={"account": value}, run_id=RUN_ID)
        )
        windows[key] = f"rates.a={value!r:.20}"
    hashed = value_window("rates.a", long).rsplit(":", 1)[1]
    for name in ("rates.a:k:1", "rates.a:k:true", "rates.a:k:null", f"rates.a:h:{hashed}"):
        other = build_definition(a_job, {"name": name, "rate_limit": "1/s"})
        [(key, _, _)] = rates_of(other, Envelope(job=name, schema=None, kwargs={}, run_id=RUN_ID))
        assert key not in windows, (name, windows[key])
        windows[key] = name
    # a name without ":" keeps its key (stored: a deploy splits no window)
    assert rates_of(define(rate_limit="1/s"), envelope(None))[0][0] == "j:rates.a_job"
    assert value_window("rates.a_job", 1) == "j:rates.a_job:k:1"
