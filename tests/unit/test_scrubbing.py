"""Unit tests for secret scrubbing: the forms it hides, what it leaves alone, and its cost.

No database, no Redis. The cost tests compare timings measured in the same test (a ratio to
a baseline of the same size), never a wall-clock bound.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable

import pytest

from kumiko_jobs import log_context
from kumiko_jobs.core.conf import DEFAULT_SENSITIVE_KEYS
from kumiko_jobs.core.scrubbing import (
    DEFAULT_LIMIT,
    is_sensitive_key,
    scrub,
    scrub_bounded,
    truncate,
)
from kumiko_jobs.run.state import Ending

KEYS = DEFAULT_SENSITIVE_KEYS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # the forms issue 17 found unscrubbed
        ("redis://:pw@host:6379/0", "redis://:***@host:6379/0"),
        ("connect redis://:p@ss@cache:6379/0 failed", "connect redis://:***@cache:6379/0 failed"),
        ("postgres://app:p@ss@db/x", "postgres://app:***@db/x"),
        ("password=p@ss@word next", "password=*** next"),
        ("{'password': b'hunter2', 'x': 1}", "{'password': b'***', 'x': 1}"),
        ("{'password': ['a', 'b'], 'x': 1}", "{'password': [***], 'x': 1}"),
        ("{'password': ('a', 'b'), 'x': 1}", "{'password': (***), 'x': 1}"),
        ('{"password"=>"hunter2", "x"=>1}', '{"password"=>"***", "x"=>1}'),
        (r'{"password": "a\"b", "user": "bob"}', '{"password": "***", "user": "bob"}'),
        ("X-Api-Key: abc123 next", "X-Api-Key: *** next"),
        ("GET /x?api-key=abc123&page=2", "GET /x?api-key=***&page=2"),
        ("body password%3Dhunter2 next", "body password%3D*** next"),
        ("body password%3dhunter2&x=1", "body password%3d***&x=1"),
        # our own additions
        ("Authorization: Bearer eyJhbGc.x.y rest", "Authorization: *** rest"),
        ("sent Bearer eyJhbGciOiJIUzI1NiJ9.abc.def ok", "sent Bearer *** ok"),
        ("token=a1&page=2", "token=***&page=2"),
        ("secret=abc token=def", "secret=*** token=***"),
        ("client_secret: 's3'", "client_secret: '***'"),
        ("DB_PASSWORD = 's3cr3t' next", "DB_PASSWORD = '***' next"),
        ("dsn postgres://user:pw@host:5432/db", "dsn postgres://user:***@host:5432/db"),
        ("amqp://guest:guest@rabbit//", "amqp://guest:***@rabbit//"),
        (r"{\"password\": \"hunter2\"}", r"{\"password\": \"***\"}"),
        ("Cookie: sessionid=abc; csrftoken=def", "Cookie: ***; csrftoken=***"),
        ("private_key='-----BEGIN KEY-----'", "private_key='***'"),
        ("PASSWORD: hunter2", "PASSWORD: ***"),
        ("password='unterminated and more", "password='***"),
    ],
)
def test_scrub_hides_the_secret(text: str, expected: str) -> None:
    assert scrub(text, KEYS) == expected


@pytest.mark.parametrize(
    "text",
    [
        "invoice 7 not found",
        "the password is wrong; try again",
        "token expired",
        "http://localhost:8000/invoices/7?page=2",
        "mail bob@example.com about order=17, total: 12.50",
        "KeyError: 'customer_id'",
        "a=b c: d {'user': 'bob', 'ids': [1, 2]}",
        'Traceback (most recent call last):\n  File "x.py", line 3, in f\nValueError: bad',
        "",
    ],
)
def test_ordinary_text_is_untouched(text: str) -> None:
    assert scrub(text, KEYS) == text


def test_configured_keys_decide_what_is_secret() -> None:
    assert scrub("pin=1234 password=x", ("pin",)) == "pin=*** password=x"
    assert scrub("pin=1234", ()) == "pin=1234"
    # "_" in a key also matches "-", "." and nothing: one key covers the spellings of headers.
    for spelling in ("api_key", "api-key", "api.key", "apikey", "X-API-KEY"):
        assert scrub(f"{spelling}=k1", ("api_key",)) == f"{spelling}=***"


def test_sensitive_field_names() -> None:
    for name in ("password", "db_password", "X-Api-Key", "apiKey", "Authorization", "token"):
        assert is_sensitive_key(name, KEYS), name
    for name in ("invoice_id", "user", "count", "tokenizer_version_not"):
        assert not is_sensitive_key(name, ("password", "api_key")), name


def test_truncate_cuts_at_whitespace_and_says_how_much_went() -> None:
    assert truncate("short", 10) == "short"
    cut = truncate("aaa bbb ccc ddd", 9)
    assert cut == "aaa bbb  [... 7 more characters]"
    # A half URL at the cut would lose the "@host" that marks its password: it is dropped.
    text = "error redis://:hunter2" + "x" * 50 + "@host"
    assert "hunter2" not in truncate(text, 20)
    assert truncate("x" * 100, 10) == " [... 100 more characters]"


def test_scrub_truncates_before_it_scrubs() -> None:
    text = "password=hunter2 " + "word " * 10_000
    out = scrub(text, KEYS, limit=100)
    assert out.startswith("password=*** word")
    assert len(out) < 150 and out.endswith("more characters]")
    assert len(scrub("word " * 10_000, KEYS)) <= DEFAULT_LIMIT + 40


def test_log_context_scrub_uses_the_setting_and_truncates(settings) -> None:  # type: ignore[no-untyped-def]
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "SENSITIVE_KEYS": ["pin"]}
    assert log_context.scrub("pin=1234 password=x") == "pin=*** password=x"
    assert len(log_context.scrub("w " * 100_000, limit=500)) < 540


# --- cost ---------------------------------------------------------------------------------

SIZE = 1_000_000


def _adversarial() -> dict[str, str]:
    """Inputs built to make a backtracking scrubber quadratic (or worse)."""
    word_10k = ("a" * 10_000 + " ") * (SIZE // 10_001)
    word_300k = ("a" * 300_000 + " ") * (SIZE // 300_001)
    return {
        "word characters": "a" * SIZE,
        "10 KB words": word_10k,
        "300 KB words": word_300k,
        "=": "=" * SIZE,
        ":": ":" * SIZE,
        "double quotes": '"' * SIZE,
        "single quotes": "'" * SIZE,
        "@": "@" * SIZE,
        "backslashes": "\\" * SIZE,
        "keys": "password" * (SIZE // 8),
        "keys with words": ("password" + "a" * 40) * (SIZE // 48),
        "key=": "password=" * (SIZE // 9),
        "open quotes": 'password="' * (SIZE // 10),
        "open quote, backslashes": 'password="' + "\\" * SIZE,
        "url heads": "://:" * (SIZE // 4),
        "url heads and words": ("://:" + "a" * 300) * (SIZE // 304),
        "url, no @ after": "x://a:" + "@" * SIZE,
        "bearer": "bearer " * (SIZE // 7),
        "encoded separators": "password%3" * (SIZE // 10),
        "key value pairs": "token_aaaa=bbbb " * (SIZE // 16),
    }


def _cost(func: Callable[[str], object], text: str, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        func(text)
        best = min(best, time.perf_counter() - start)
    return best


PLAIN = ("Invoice 7 of customer 42 was paid on time, thank you. " * (SIZE // 50))[:SIZE]


@pytest.mark.parametrize("name", list(_adversarial()))
def test_the_patterns_are_linear_on_adversarial_text(name: str) -> None:
    """1 MB of adversarial text through the patterns themselves (no truncation) costs at most
    20 times 1 MB of plain prose: the patterns are linear. The old scrubber took 11.6 s on
    10 KB of word characters and did not finish 300 KB within 600 s."""
    text = _adversarial()[name]
    baseline = _cost(lambda t: scrub_bounded(t, KEYS), PLAIN)
    cost = _cost(lambda t: scrub_bounded(t, KEYS), text)
    assert cost < 20 * baseline, f"{name}: {cost / baseline:.1f}x plain text"


def test_scrub_of_one_megabyte_costs_no_more_than_lowercasing_it_a_few_times() -> None:
    """The public scrub() truncates first: whatever the 1 MB is, it costs about what scrubbing
    DEFAULT_LIMIT characters does, measured against str.lower() of the same megabyte."""
    baseline = _cost(str.lower, PLAIN)
    worst = max(_cost(lambda t: scrub(t, KEYS), text) for text in _adversarial().values())
    scrub_plain = _cost(lambda t: scrub(t, KEYS), PLAIN)
    # Scrubbing 16 KB of plain text, and any 1 MB, are of the same order.
    assert worst < 20 * max(scrub_plain, baseline)


def test_linear_growth_from_quarter_to_full_size() -> None:
    """Four times the input costs about four times as much (quadratic would be sixteen)."""
    text = ("password" + "a" * 40 + " token=" + "b" * 30 + " ://:" + "c" * 20 + " ") * 40_000
    quarter = _cost(lambda t: scrub_bounded(t, KEYS), text[: len(text) // 4])
    full = _cost(lambda t: scrub_bounded(t, KEYS), text)
    assert full < 8 * quarter


# --- the span's exception event -------------------------------------------------------------


def test_the_span_exception_event_is_built_scrubbed_and_bounded() -> None:
    """The SDK never sees the raw exception: the event is added with our attributes only."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    # steps/__init__ exports the step function under the module's name.
    tracing = importlib.import_module("kumiko_jobs.run.steps.tracing")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    error = RuntimeError("connect redis://:hunter2@cache/0 password=hunter2 " + "a " * 500_000)
    with provider.get_tracer("test").start_as_current_span("job.execute") as span:
        # A run that ended with this error, not yet rendered by the db_guard step.
        ending = Ending()
        ending.fail(error)
        tracing._record_error(span, ending, error, escaped=False)
    (finished,) = exporter.get_finished_spans()
    (event,) = finished.events
    attributes = dict(event.attributes or {})
    assert event.name == "exception" and attributes["exception.type"] == "RuntimeError"
    message = str(attributes["exception.message"])
    assert message.startswith("connect redis://:***@cache/0 password=*** a a")
    assert len(message) <= tracing.MESSAGE_LIMIT + 40
    stacktrace = str(attributes["exception.stacktrace"])
    assert len(stacktrace) <= tracing.STACKTRACE_LIMIT + 60
    everything = repr(attributes) + (finished.status.description or "")
    assert "hunter2" not in everything
