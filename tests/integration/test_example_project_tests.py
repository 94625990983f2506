"""Collects the example project's own tests (the suite's testpaths is ``tests/``)."""

from __future__ import annotations

from example_project.billing.tests.test_jobs import *  # noqa: F403
