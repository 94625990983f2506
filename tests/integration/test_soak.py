"""The short soak (bench/soak.py) in CI: about 1,000 runs, workers killed, Redis restarted.

Runs on this suite's database and tenants, with a Redis server of its own (restarting the
machine's Redis would disturb everybody else). The full soak is ``python -m bench.soak``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from bench import soak
from tests.conftest import TENANTS, worker_env

pytestmark = pytest.mark.usefixtures("live_db")


def run_soak_in_suite(config: soak.SoakConfig) -> tuple[Any, list[str]]:
    """``config``'s soak on a Redis server of its own (restartable), with the suite's database
    and settings plus the soak's fast recovery; returns the report and its progress lines."""
    redis = soak.OwnRedis().start()
    db = os.environ["KUMIKO_TEST_REDIS_DB"]
    env = worker_env()
    env["REDIS_URL"] = redis.url(db)
    env[soak.SETTINGS_ENV] = json.dumps({**settings.KUMIKO_JOBS, **soak.FAST_RECOVERY})
    env.setdefault("KUMIKO_LOG", "ERROR")
    queues = {name: {**cfg, "URL": redis.url(db)} for name, cfg in settings.RQ_QUEUES.items()}
    lines: list[str] = []
    try:
        with override_settings(
            RQ_QUEUES=queues, KUMIKO_JOBS={**settings.KUMIKO_JOBS, **soak.FAST_RECOVERY}
        ):
            report = soak.run_soak(config, list(TENANTS), redis, env, log=lines.append)
    finally:
        redis.close()
    return report, lines


def test_short_soak_loses_nothing_and_never_crosses_tenants(tenants: dict[str, Any]) -> None:
    config = soak.SoakConfig(jobs=1000, workers=2, kill_every=(2.0, 4.0), timeout=240)
    report, lines = run_soak_in_suite(config)
    summary = "\n".join([*lines, *report.lines()])
    print(summary)  # the figures, in the CI log (-s) or on failure

    assert report.committed == 1000 + report.committed_during_outage, summary
    assert report.committed_during_outage > 0, summary
    assert report.kills > 0 and report.redis_restarts == 1, summary
    assert (report.lost, report.stuck, report.wrong_schema) == (0, 0, 0), summary
    assert report.statuses == {"succeeded": report.committed}, summary
