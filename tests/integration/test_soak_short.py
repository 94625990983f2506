"""The short chaos soak in CI (issue 28): about 2,000 runs with every fault kind mixed.

bench/soak.py's ``SHORT`` profile (``python -m bench.soak --short`` standalone): plain and
atomic soak runs, batch by batch, over this suite's tenants, drained by two real workers and a
real rqscheduler while, all at once:

* a random worker is SIGKILLed every few seconds and started again;
* Redis (a server of the test's own, on a port of its own) restarts once, losing everything it
  held, while runs are committed;
* every PostgreSQL session of the workers and the scheduler is ended (``pg_terminate_backend``)
  every few seconds;
* the workers reach PostgreSQL and Redis through tests/chaos/proxy.py, which adds latency per
  chunk until the Redis restart and cuts every connection every few seconds throughout.

At the end, from PostgreSQL and the jobs' own execution log: lost 0, stuck 0 (none left
``running`` or waiting), wrong schema 0, atomic duplicates 0, and each plain duplicate a run
whose attempt a fault ended between its effect and its success (see the assertion).
The figures are printed as a table (``-s``, or on failure). No assertion on time.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench import soak
from tests.integration.test_soak import run_soak_in_suite

pytestmark = pytest.mark.usefixtures("live_db")


def test_short_soak_with_every_fault_mixed(tenants: dict[str, Any]) -> None:
    config = soak.SoakConfig(workers=2, **soak.SHORT)
    report, lines = run_soak_in_suite(config)
    summary = "\n".join([*lines, *report.lines(), "", *report.table()])
    print(summary)  # the figures, in the CI log (-s) or on failure

    plain, atomic = soak.JOBS["plain"], soak.ATOMIC_JOB
    assert report.committed == config.jobs + report.committed_during_outage, summary
    assert report.committed_by_job[plain] > 0 and report.committed_by_job[atomic] > 0, summary
    # Every fault kind did happen.
    assert report.committed_during_outage > 0 and report.redis_restarts == 1, summary
    assert report.kills > 0, summary
    assert report.sessions_terminated > 0, summary
    assert report.network_cuts > 0 and report.connections_cut > 0, summary
    # What survives them.
    assert (report.lost, report.stuck, report.wrong_schema) == (0, 0, 0), summary
    assert report.statuses == {"succeeded": report.committed}, summary  # none running
    assert report.duplicated_by_job[atomic] == 0, summary
    # A plain run repeats its effect only when a fault ended its attempt after the body's
    # effect committed: its worker killed (or gone) before the success's commit, its own
    # INSERT's reply lost to a cut or a terminated session after PostgreSQL committed it (the
    # job sees an OperationalError and is retried), or, if writing the finish again failed
    # too, a finish cut off (docs/reliability.md, "What each plain duplicate was"). The report
    # names the fault of each (``_cause``): none may be anything else, and there are no more
    # duplicates than fault events. Their share is printed, not bounded at 0.1 %: it is the
    # fault rate per run times the window, not a property of the code.
    faults = report.kills + report.worker_exits + report.termination_rounds + report.network_cuts
    fault_causes = {
        "SIGKILL",
        "worker exit",
        "pg_terminate_backend",
        "network cut",
        "OperationalError after the effect",
        "InterfaceError after the effect",
    }
    assert set(report.duplicate_causes) <= fault_causes, summary
    assert report.duplicated_by_job[plain] <= faults, summary
