"""A module with an import side effect, which no run may import by naming it (test_task_jobs).

Importing it records the import (in ``canary_record``, and in the file named by
``KUMIKO_TEST_CANARY_FILE`` for worker processes), and it even holds a real ``@task``: before
the task job resolved its ``task`` argument against the known tasks, a run naming
``tests.testapp.import_canary.planted`` imported this module and ran that task."""

from __future__ import annotations

import os

from django.tasks import task

from . import canary_record


def _record(what: str) -> None:
    canary_record.IMPORTS.append(what)
    path = os.environ.get("KUMIKO_TEST_CANARY_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{what}\n")


_record(__name__)


@task
def planted() -> str:
    _record("planted ran")
    return "planted"
