"""An atomic run's COMMIT whose reply is lost: committed on the server, unheard by the worker.

``@job(atomic=True)`` commits the body's writes and the run's success in one transaction. If
the connection is cut after PostgreSQL committed it and before its answer reached the worker,
the worker's COMMIT raises a connection error, the same error as a COMMIT that never arrived.
It used to be taken for a failure: the attempt was recorded ``retrying`` over the row the success
function had marked ``succeeded`` (the finish's UPDATE names the run only), and the retry ran
the body again: an atomic duplicate. The records step now asks the row first
(``run.steps.records._settle_in_doubt``): ``succeeded`` with this attempt is the success it was.

A real ``rqworker`` (and an ``rqscheduler``, which a wrongly scheduled retry would need) reach
PostgreSQL through tests/chaos/proxy.py, which cuts the connection on which the job wrote its
probe at the moment the server's CommandComplete for COMMIT passes towards the worker. The
test's own process talks to PostgreSQL directly. Nothing is mocked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection

from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from tests.chaos.proxy import Proxy
from tests.chaos.workers import Processes
from tests.conftest import probes, worker_env
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

TAG = "commit-reply-lost"


@pytest.fixture
def pg_proxy() -> Iterator[Proxy]:
    db = connection.settings_dict
    proxy = Proxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))).start()
    yield proxy
    proxy.close()


def _database_through(proxy: Proxy) -> dict[str, str]:
    """A worker's environment with PostgreSQL (the project's and the tenant logins') through
    ``proxy``; Redis direct."""
    env = worker_env()
    db = urlsplit(env["DATABASE_URL"])
    netloc = db.netloc.rsplit("@", 1)[0] + "@" if "@" in db.netloc else ""
    env["DATABASE_URL"] = urlunsplit(db._replace(netloc=netloc + proxy.url_netloc()))
    return env


def _attempts(run_id: Any) -> list[tuple[int, str]]:
    rows = JobAttempt.objects.filter(run_id=run_id).order_by("number")
    return list(rows.values_list("number", "outcome"))


def test_an_atomic_commit_whose_reply_was_lost_runs_once(
    tenants: dict[str, Any], procs: Processes, pg_proxy: Proxy
) -> None:
    env = _database_through(pg_proxy)
    procs.start(env=env)
    procs.start("rqscheduler", "--interval", "1", env=env)
    procs.wait_ready(1, scheduler=True)
    # The job's INSERT carries the tag: the connection that sends it is the body's, and its
    # next COMMIT is the run's (body and success together).
    pg_proxy.cut_reply(after=TAG.encode())
    handle = jobs.atomic_write.enqueue(tenant="t1", tag=TAG)

    def recorded() -> bool:
        # The attempt row's success commits with the body (the finish rides on the atomic
        # transaction), so it is there before the worker hears its COMMIT's reply was lost;
        # the worker has settled the attempt once it has said whether that COMMIT committed
        # (a loaded machine's worker said it after the test had read the log, 2 of 4 runs).
        settled = "its COMMIT's reply was lost" in procs.logs()
        return settled and any(outcome == "succeeded" for _, outcome in _attempts(handle.run_id))

    procs.wait_for(
        "the run's success recorded",
        recorded,
        explain=lambda: f"attempts {_attempts(handle.run_id)}, cuts {pg_proxy.replies_cut}",
    )
    assert pg_proxy.replies_cut == 1  # the COMMIT's reply was swallowed, the connection cut

    run = JobRun.objects.get(pk=handle.run_id)
    effects = [p.attempt for p in probes("t1") if p.tag == TAG]
    attempts = _attempts(handle.run_id)
    # Committed once, recorded as the success it was, not retried: one effect, one attempt.
    assert effects == [1], (effects, attempts, procs.logs())
    assert (run.status, run.attempts) == (RunStatus.SUCCEEDED, 1), attempts
    assert attempts == [(1, "succeeded")]
    assert run.result == TAG  # the body's result, kept through the lost reply
    assert "its COMMIT's reply was lost, and it had committed" in procs.logs()
