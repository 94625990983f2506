"""kumiko_jobs' public functions survive the packages named like them.

Loading a submodule binds its name on the parent package. The enqueue side's package is
``kumiko_jobs.enqueueing``, not ``kumiko_jobs.enqueue``: a package of that name would replace
the function users call (``kumiko_jobs.enqueue("billing.sync", ...)``) the first time anything
imported it.
"""

from __future__ import annotations

import importlib
import importlib.resources

import kumiko_jobs


def test_enqueue_is_the_function_after_the_enqueue_side_is_loaded() -> None:
    importlib.import_module("kumiko_jobs.enqueueing.followups")
    api = importlib.import_module("kumiko_jobs.enqueueing.api")
    assert callable(kumiko_jobs.enqueue)
    assert kumiko_jobs.enqueue is api.enqueue
    from kumiko_jobs import enqueue

    assert callable(enqueue)


def test_no_package_or_module_is_named_like_a_public_function() -> None:
    """The clash this file is about, for every public name: none is also a submodule."""
    package = importlib.import_module("kumiko_jobs")
    root = importlib.resources.files("kumiko_jobs")
    submodules = {p.name.removesuffix(".py") for p in root.iterdir()}
    clashes = [
        name for name in package.__all__ if callable(getattr(package, name)) and name in submodules
    ]
    assert clashes == []


def test_current_user_outside_a_run_is_none() -> None:
    assert kumiko_jobs.current_user() is None
