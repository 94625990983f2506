"""The example project's settings with ``DB_ROLES`` from ``KUMIKO_BENCH_DB_ROLES`` ("0": off):
bench/tenants.py's worker processes read it (they cannot take an override from the bench)."""

import os

from example_project.settings import *  # noqa: F403
from example_project.settings import KUMIKO_JOBS as _KUMIKO_JOBS

KUMIKO_JOBS = {**_KUMIKO_JOBS, "DB_ROLES": os.environ.get("KUMIKO_BENCH_DB_ROLES", "1") != "0"}
