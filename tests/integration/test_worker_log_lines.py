"""The worker's log names job, tenant, run id and outcome, never RQ's "Job OK" after a failure.

A real in-process kumiko worker drains real messages; caplog sees every logger, RQ's too.
"""

from __future__ import annotations

import logging

import pytest

from tests.conftest import work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name} {r.levelname} {r.getMessage()}" for r in caplog.records]


def test_log_lines_name_the_run_and_its_outcome(tenants, caplog):
    for name in ("kumiko_jobs.runs", "rq.worker"):
        caplog.set_level(logging.INFO, logger=name)
    flaky = jobs.flaky.enqueue(tenant="t1", tag="log-flaky", fail_times=1)
    ok = jobs.probe.enqueue(tenant="t2", tag="log-ok")
    work(scheduler_rounds=1)
    said = lines(caplog)

    # The failed first attempt, the successful retry and the other run: one line each, by name.
    assert any(
        line.startswith("kumiko_jobs.runs WARNING attempt failed: ")
        and f"job={flaky.job_name} run_id={flaky.run_id} tenant=t1 attempt=1/" in line
        for line in said
    ), said
    assert any(
        line.startswith(
            f"kumiko_jobs.runs INFO run succeeded: job={flaky.job_name} tenant=t1 "
            f"run_id={flaky.run_id} attempt=2/"
        )
        for line in said
    ), said
    assert any(
        line.startswith(
            f"kumiko_jobs.runs INFO run succeeded: job={ok.job_name} tenant=t2 "
            f"run_id={ok.run_id} attempt=1/"
        )
        for line in said
    ), said

    rq_lines = [line for line in said if line.startswith("rq.")]
    assert rq_lines, "RQ's own lines (worker start, dequeue) are still there"
    # ...but not its misleading outcome lines, nor the truncated JSON envelope.
    assert not [
        line
        for line in rq_lines
        if "Job OK" in line or "Successfully completed" in line or "result is kept" in line
    ]
    assert not [line for line in said if "kumiko_jobs.runner.execute(" in line]
