"""Unit tests for the readers of other projects' settings (core/project_settings.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import override_settings

import kumiko_jobs
from kumiko_jobs.core import project_settings

READERS = {"core/conf.py", "core/project_settings.py"}


def test_only_the_two_readers_import_django_settings():
    """Everything else asks conf.py or project_settings.py: one default, one spelling each."""
    root = Path(kumiko_jobs.__file__).parent
    readers = {
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if re.search(r"from django\.conf import settings|django\.conf\.settings", path.read_text())
    }
    assert readers == READERS


@pytest.mark.parametrize("setting", ["SHARED_APPS", "TENANT_APPS"])
def test_shared_apps_cache_is_cleared_with_the_setting(setting):
    before = project_settings.shared_apps()
    with override_settings(**{setting: ["only.this"]}):
        index = 0 if setting == "SHARED_APPS" else 1
        assert project_settings.shared_apps()[index] == frozenset({"only.this"})
    assert project_settings.shared_apps() == before


def test_readers_of_other_projects_settings_are_not_cached():
    with override_settings(RQ_QUEUES={"x": {"URL": "redis://h/1"}}, RQ={"WORKER_CLASS": "w"}):
        assert project_settings.rq_queue_names() == ("x",)
        assert project_settings.rq_queue_config("x") == {"URL": "redis://h/1"}
        assert project_settings.rq_queue_config("missing") == {}
        assert project_settings.rq_option("WORKER_CLASS") == "w"
        assert project_settings.rq_option("SCHEDULER_CLASS", "fallback") == "fallback"
    assert "default" in project_settings.rq_queue_names()
    with override_settings(PUBLIC_SCHEMA_NAME="shared", TENANT_LIMIT_SET_CALLS=True):
        assert project_settings.public_schema_name() == "shared"
        assert project_settings.limit_set_calls() is True
    assert project_settings.public_schema_name() == "public"
    assert project_settings.tenant_model_label() == "customers.Client"
    assert project_settings.has_tenant_settings() is True


def test_missing_rq_settings_read_as_empty(settings):
    del settings.RQ_QUEUES
    del settings.RQ
    assert project_settings.rq_queue_names() == ()
    assert project_settings.rq_option("WORKER_CLASS") is None


def test_extra_search_paths_are_read_from_django_tenants_setting(settings):
    settings.PG_EXTRA_SEARCH_PATHS = ["extensions"]
    assert project_settings.extra_search_paths() == ("extensions",)
    del settings.PG_EXTRA_SEARCH_PATHS
    assert project_settings.extra_search_paths() == ()
