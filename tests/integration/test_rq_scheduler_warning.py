"""``manage.py rqworker --with-scheduler`` warns at start that RQ's own scheduler does not serve
kumiko (delayed work waits in rq-scheduler's keys, which only ``rqscheduler`` moves).

A real ``rqworker`` process in burst mode, as a user starts it; the control starts the same
worker without the flag and sees no warning.
"""

from __future__ import annotations

import pytest

from tests.conftest import start_rqworker

WARNING = "rqworker --with-scheduler starts RQ's own scheduler, which does not serve kumiko"


@pytest.mark.parametrize("flags", [("--with-scheduler",), ()], ids=["with-scheduler", "control"])
def test_rqworker_with_rqs_scheduler_warns_at_start(live_db: None, flags: tuple[str, ...]) -> None:
    worker = start_rqworker("--burst", *flags, "default")
    output, _ = worker.communicate(timeout=120)
    assert worker.returncode == 0, output
    if flags:
        assert WARNING in output, output
        assert "manage.py rqscheduler --interval 1" in output
    else:
        assert WARNING not in output, output
