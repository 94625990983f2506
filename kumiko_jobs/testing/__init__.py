"""Test your own jobs: a pytest plugin that runs what is enqueued, in-process, through the
real pipeline, and cleans up after itself.

In the project's top-level ``conftest.py``::

    pytest_plugins = ["kumiko_jobs.testing"]

That gives every test the ``kumiko_jobs`` fixture (``run()``, ``runs()``, ``assert_enqueued()``,
...; ``KumikoJobs``), which also keeps every push away from Redis (``captured_pushes``), so a
``transaction=True`` test, whose enqueues really commit, needs no Redis either. ``run_jobs()``
(``runs``) runs the waiting runs as a worker would; under ``DB_ROLES`` each tenant body runs as
its tenant's database role, as on a worker, in the ``db`` fixture's transaction too
(``inline_roles``). At the end of the session the plugin closes the tenants' logins and drops
the roles of the test databases it saw dropped (``session``), whatever ``django_db_setup`` the
project uses. docs/testing.md has the details and a worked example.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .assertions import KumikoJobs
from .inline_roles import MissingTenantRole
from .pushes import Pushes, captured_pushes
from .runs import WORKER_NAME, Ran, TooManyRuns, run_jobs
from .session import pytest_fixture_post_finalizer, pytest_fixture_setup

__all__ = [
    "WORKER_NAME",
    "KumikoJobs",
    "MissingTenantRole",
    "Pushes",
    "Ran",
    "TooManyRuns",
    "captured_pushes",
    "kumiko_jobs",
    "pytest_fixture_post_finalizer",
    "pytest_fixture_setup",
    "run_jobs",
]


@pytest.fixture
def kumiko_jobs() -> Iterator[KumikoJobs]:
    """Run and inspect jobs in a test with a database (``db`` or ``transactional_db``):
    pushes are captured, never sent to Redis."""
    with captured_pushes() as pushes:
        yield KumikoJobs(pushes)
