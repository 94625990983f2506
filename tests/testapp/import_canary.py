"""A module with an import side effect, which no run may import by naming it (test_task_jobs).

Importing it records the import, and it even holds a real ``@task``: before the task job
resolved its ``task`` argument against the known tasks, a run naming
``tests.testapp.import_canary.planted`` imported this module and ran that task."""

from __future__ import annotations

from django.tasks import task

from . import canary_record

canary_record.IMPORTS.append(__name__)


@task
def planted() -> str:
    canary_record.IMPORTS.append("planted ran")
    return "planted"
