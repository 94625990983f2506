"""The example project's settings for bench/lateness.py's worker and scheduler processes, with
``SCHEDULER_POLL`` from ``KUMIKO_BENCH_SCHEDULER_POLL`` when it is set (unset: the default;
releases before the setting existed refuse the key, so it is only added when asked for)."""

from __future__ import annotations

import os

from example_project.settings import *  # noqa: F403
from example_project.settings import KUMIKO_JOBS as _KUMIKO_JOBS

_POLL = os.environ.get("KUMIKO_BENCH_SCHEDULER_POLL")
KUMIKO_JOBS = {**_KUMIKO_JOBS, **({"SCHEDULER_POLL": float(_POLL)} if _POLL else {})}
