"""``manage.py kumiko_jobs`` answers bad input with a usage error, never a traceback (issue 22).

Each case runs the real command line, ``python manage.py kumiko_jobs ...`` in its own process
with the suite's settings, database and Redis (``worker_env``), as a user types it (bytes that
are not UTF-8 included: Python hands them to the command as lone surrogates). Asserted: the
exit code is not 0, the message names the problem, and no ``Traceback`` is printed.

Seen failing with management/commands/kumiko_jobs.py (and core/text.py, enqueueing/validate.py)
reverted: ``--since``/``--limit`` overflows, deep ``--kwargs``, surrogates and NULs in flags
printed tracebacks, and ``relay --loop --interval -1`` ran a round before dying.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from kumiko_jobs.models import JobRun
from tests.conftest import ROOT, worker_env
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def kumiko_jobs(*args: str | bytes) -> subprocess.CompletedProcess[bytes]:
    """``manage.py kumiko_jobs ARGS`` as a separate process; its output as bytes."""
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "kumiko_jobs", *args],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        timeout=120,
        check=False,
    )


def assert_usage_error(result: subprocess.CompletedProcess[bytes], *words: str) -> str:
    """Refused as a usage error: exit code not 0, each of ``words`` said, no traceback."""
    output = (result.stdout + result.stderr).decode("utf-8", "replace")
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    for word in words:
        assert word in output, output
    return output


def test_calibration_the_command_line_works(tenants):
    """The same route, with good input, does what it says (so a refusal below is the input's)."""
    result = kumiko_jobs("runs", "--since", "1h", "--limit", "5")
    assert result.returncode == 0, result.stderr
    assert b"no runs match" in result.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("runs", "--since", "99999999999d"), ("--since", "at most 9 digits")),
        (("runs", "--since", "9" * 5000 + "d"), ("--since", "at most 9 digits")),
        (("runs", "--since", "999999999d"), ("--since", "before the year 1")),
        (("runs", "--limit", "99999999999999999999"), ("--limit", "between 1 and")),
        (("runs", "--limit", "0"), ("--limit", "between 1 and")),
        (("runs", "--limit", "9" * 5000), ("--limit", "invalid int value")),
    ],
    ids=[
        "since-digits",
        "since-5000-digits",
        "since-overflow",
        "limit-bigint",
        "limit-0",
        "limit-5000-digits",
    ],
)
def test_runs_refuses_out_of_range_flags(tenants, args, words):
    assert_usage_error(kumiko_jobs(*args), *words)


def test_enqueue_refuses_deeply_nested_kwargs(tenants):
    deep = "[" * 20_000 + "]" * 20_000  # argv holds at most 128 KB per argument
    result = kumiko_jobs(
        "enqueue", jobs.probe.name, "--tenant", "t1", "--kwargs", f'{{"tag": {deep}}}'
    )
    assert_usage_error(result, "--kwargs", "nested too deeply")
    assert not JobRun.objects.exists()


def test_enqueue_refuses_a_5000_digit_integer(tenants):
    result = kumiko_jobs(
        "enqueue", jobs.probe.name, "--tenant", "t1", "--kwargs", f'{{"tag": {"7" * 5000}}}'
    )
    assert_usage_error(result, "--kwargs", "more than 4300 digits")
    assert not JobRun.objects.exists()


@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff", "\\u0000"], ids=["high", "low", "nul"])
def test_enqueue_refuses_kwargs_postgresql_cannot_store(tenants, escape):
    """JSON escapes make lone surrogates (and NUL): refused with the enqueue's words."""
    result = kumiko_jobs(
        "enqueue", jobs.probe.name, "--tenant", "t1", "--kwargs", f'{{"tag": "a{escape}"}}'
    )
    problem = "NUL character" if escape == "\\u0000" else "lone surrogate"
    assert_usage_error(result, "tag", problem)
    assert not JobRun.objects.exists()


# Bytes that are not UTF-8 reach the command as lone surrogates (\udcff): PostgreSQL's driver
# raised on them in the first query. NUL cannot be passed in argv at all (the OS refuses it).
NOT_UTF8 = b"t\xff1"


@pytest.mark.parametrize(
    "args",
    [
        (b"runs", b"--tenant", NOT_UTF8),
        (b"runs", b"--job", NOT_UTF8),
        (b"enqueue", jobs.probe.name.encode(), b"--tenant", NOT_UTF8),
        (b"enqueue", NOT_UTF8, b"--tenant", b"t1"),
        (
            b"enqueue",
            jobs.probe.name.encode(),
            b"--tenant",
            b"t1",
            b"--kwargs",
            b'{"tag": "' + NOT_UTF8 + b'"}',
        ),
        (b"retry", NOT_UTF8),
        (b"cancel", NOT_UTF8),
    ],
    ids=[
        "runs-tenant",
        "runs-job",
        "enqueue-tenant",
        "enqueue-job",
        "enqueue-kwargs",
        "retry",
        "cancel",
    ],
)
def test_flags_refuse_bytes_that_are_not_text(tenants, args):
    assert_usage_error(kumiko_jobs(*args), "lone surrogate")
    assert not JobRun.objects.exists()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--interval", "-1"), ("--interval", "more than 0")),
        (("--interval", "0"), ("--interval", "more than 0")),
        (("--interval", "nan"), ("--interval",)),
        (("--interval", "inf"), ("--interval",)),
        (("--interval", "1e300"), ("--interval", "at most")),
        (("--grace", "-1"), ("--grace", "at least 0")),
        (("--grace", "1e300"), ("--grace", "at most")),
        (("--interval", "soon"), ("--interval", "invalid float value")),
    ],
    ids=["negative", "zero", "nan", "inf", "huge", "grace-negative", "grace-huge", "word"],
)
def test_relay_loop_refuses_a_bad_interval_before_its_first_round(tenants, args, words):
    """It used to run one round (and print it) and then die in time.sleep(-1)."""
    result = kumiko_jobs("relay", "--loop", *args)
    output = assert_usage_error(result, *words)
    assert "checked" not in output  # no round ran


def test_retry_and_cancel_of_a_run_that_is_not_there(tenants: dict[str, Any]):
    assert_usage_error(kumiko_jobs("retry", "0" * 32), "No run")
    assert_usage_error(kumiko_jobs("cancel", "not-a-uuid"), "no run")
