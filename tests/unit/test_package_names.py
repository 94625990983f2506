"""kumiko_jobs' public functions survive the packages named like them.

Loading a submodule binds its name on the parent package: once ``kumiko_jobs.enqueue`` (the
enqueue side's package) is loaded, ``kumiko_jobs.enqueue`` must still be the function users call.
"""

from __future__ import annotations

import importlib

import kumiko_jobs


def test_enqueue_is_the_function_after_the_enqueue_package_is_loaded() -> None:
    importlib.import_module("kumiko_jobs.enqueue.followups")
    api = importlib.import_module("kumiko_jobs.enqueue.api")
    assert callable(kumiko_jobs.enqueue)
    assert kumiko_jobs.enqueue is api.enqueue
    from kumiko_jobs import enqueue

    assert callable(enqueue)


def test_current_user_outside_a_run_is_none() -> None:
    assert kumiko_jobs.current_user() is None
