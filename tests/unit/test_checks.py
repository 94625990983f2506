"""System checks: each id fires on a realistic mistake and stays quiet on the good setting.

Settings only (``override_settings``), no database.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core import checks as django_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from kumiko_jobs import checks
from kumiko_jobs.definition.options import build_definition
from kumiko_jobs.definition.registry import Registry
from kumiko_jobs.enqueueing import checks as enqueueing_checks
from kumiko_jobs.transport import Scheduler
from kumiko_jobs.worker import Worker


class MyWorker(Worker):
    """A project's own subclass of the kumiko worker."""


class MyScheduler(Scheduler):
    pass


def run(**overrides: Any) -> list[django_checks.CheckMessage]:
    with override_settings(**overrides):
        return checks.check_settings()


def ids(messages: list[django_checks.CheckMessage]) -> list[str]:
    return [str(m.id) for m in messages]


def only(messages: list[django_checks.CheckMessage], check_id: str) -> django_checks.CheckMessage:
    found = [m for m in messages if m.id == check_id]
    assert len(found) == 1, ids(messages)
    return found[0]


def without(setting: str, name: str) -> list[str]:
    return [a for a in getattr(django_settings, setting) if a != name]


def rq_with(**changes: Any) -> dict[str, Any]:
    rq = dict(django_settings.RQ)
    for key, value in changes.items():
        if value is None:
            rq.pop(key, None)
        else:
            rq[key] = value
    return rq


@pytest.fixture
def jobs_on_queues(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """A fresh registry for the queue check, instead of the project's frozen one."""
    fresh = Registry()
    monkeypatch.setattr(enqueueing_checks, "registry", fresh)  # where the queue check reads it
    yield fresh


def _job(ctx: Any) -> None:
    pass


def add_job(registry: Registry, name: str, queue: str | None = None) -> None:
    registry.register(build_definition(_job, {"name": name, "queue": queue}))


# --- the control: the test project is configured right ----------------------------------------


def test_the_test_settings_pass_every_check():
    assert checks.check_settings() == []


def test_checks_are_registered_with_django():
    call_command("check")  # no SystemCheckError
    with (
        override_settings(RQ=rq_with(SCHEDULER_CLASS="rq_scheduler.Scheduler")),
        pytest.raises(SystemCheckError, match=r"kumiko_jobs\.E007"),
    ):
        call_command("check")


# --- E001 bad KUMIKO_JOBS ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kumiko_jobs", "text"),
    [
        ({"DB_GAURD": "enforce"}, "Did you mean 'DB_GUARD'?"),
        ({"DB_GUARD": "strict"}, "use one of ('enforce', 'log', 'off')"),
        ({"MAX_DEFERS": -1}, "must be an integer >= 0"),
        ({"SENSITIVE_KEYS": 5}, "must be a list of strings"),
        (["DB_GUARD", "off"], "must be a dict"),
    ],
)
def test_e001_bad_kumiko_jobs_setting(kumiko_jobs, text):
    messages = run(KUMIKO_JOBS=kumiko_jobs)
    assert ids(messages) == ["kumiko_jobs.E001"]  # nothing else is checked on bad settings
    error = messages[0]
    assert error.level == django_checks.ERROR
    assert text in error.msg
    assert error.hint == "Fix settings.KUMIKO_JOBS (see docs/settings.md)."


def test_e001_quiet_on_good_settings():
    assert "kumiko_jobs.E001" not in ids(run(KUMIKO_JOBS={"DB_GUARD": "log", "MAX_DEFERS": 0}))


# --- E002 / E003 apps missing, read fresh from INSTALLED_APPS ---------------------------------


def test_e002_django_tenants_missing():
    assert "kumiko_jobs.E002" not in ids(checks.check_settings())
    error = only(
        run(INSTALLED_APPS=without("INSTALLED_APPS", "django_tenants")), "kumiko_jobs.E002"
    )
    assert "needs django-tenants" in error.msg
    assert "'django_tenants' first in SHARED_APPS and INSTALLED_APPS" in error.hint
    # Read fresh on every call: gone again with the setting restored.
    assert "kumiko_jobs.E002" not in ids(checks.check_settings())


def test_e003_django_rq_missing():
    error = only(run(INSTALLED_APPS=without("INSTALLED_APPS", "django_rq")), "kumiko_jobs.E003")
    assert "needs django-rq" in error.msg and "'django_rq'" in error.hint
    assert "kumiko_jobs.E003" not in ids(checks.check_settings())


# --- E004 engine, read fresh from DATABASES ---------------------------------------------------


@pytest.mark.parametrize(
    "engine",
    ["django.db.backends.postgresql", "django.db.backends.sqlite3", "django_tenants.postgis"],
)
def test_e004_database_engine_is_not_django_tenants(engine):
    databases = copy.deepcopy(django_settings.DATABASES)
    databases["default"]["ENGINE"] = engine
    with pytest.warns(UserWarning, match="Overriding setting DATABASES"):
        messages = run(DATABASES=databases)
    error = only(messages, "kumiko_jobs.E004")
    assert repr(engine) in error.msg
    assert "'django_tenants.postgresql_backend'" in error.hint
    assert "kumiko_jobs.E004" not in ids(checks.check_settings())


def test_e004_quiet_with_the_tenant_engine():
    assert django_settings.DATABASES["default"]["ENGINE"] == checks.TENANT_ENGINE
    assert "kumiko_jobs.E004" not in ids(checks.check_settings())


# --- E005 kumiko_jobs in SHARED_APPS only ------------------------------------------------------


def test_e005_not_in_shared_apps():
    error = only(run(SHARED_APPS=without("SHARED_APPS", "kumiko_jobs")), "kumiko_jobs.E005")
    assert "public schema" in error.msg
    assert error.hint == "List 'kumiko_jobs' in SHARED_APPS and not in TENANT_APPS."


def test_e005_also_in_tenant_apps():
    tenant_apps = [*django_settings.TENANT_APPS, "kumiko_jobs"]
    only(run(TENANT_APPS=tenant_apps), "kumiko_jobs.E005")


def test_e005_cache_follows_the_setting():
    only(run(SHARED_APPS=without("SHARED_APPS", "kumiko_jobs")), "kumiko_jobs.E005")
    assert "kumiko_jobs.E005" not in ids(checks.check_settings())


def test_e005_quiet_without_tenant_settings_at_all(settings):
    # A project that is not (yet) a django-tenants project gets E002/E004, not E005 noise.
    del settings.TENANT_MODEL
    settings.SHARED_APPS = []
    assert "kumiko_jobs.E005" not in ids(checks.check_settings())


# --- E006 queue missing from RQ_QUEUES --------------------------------------------------------


def test_e006_a_jobs_queue_is_not_in_rq_queues(jobs_on_queues):
    add_job(jobs_on_queues, "reports.monthly", queue="reports")
    add_job(jobs_on_queues, "reports.weekly", queue="reports")
    add_job(jobs_on_queues, "billing.sync")  # default queue, which exists
    error = only(checks.check_settings(), "kumiko_jobs.E006")
    assert error.msg == (
        "Queue 'reports' used by reports.monthly, reports.weekly is not in RQ_QUEUES."
    )
    assert error.hint == "Add RQ_QUEUES['reports'] or change the job's queue=."
    queues = {**django_settings.RQ_QUEUES, "reports": {"URL": "redis://127.0.0.1:6379/0"}}
    assert "kumiko_jobs.E006" not in ids(run(RQ_QUEUES=queues))


def test_e006_default_queue_missing_is_reported_once_for_its_jobs(jobs_on_queues):
    add_job(jobs_on_queues, "billing.sync")
    messages = run(KUMIKO_JOBS={"DEFAULT_QUEUE": "nope"})
    error = only(messages, "kumiko_jobs.E006")
    assert "Queue 'nope' used by billing.sync" in error.msg


def test_e006_default_queue_missing_without_jobs(jobs_on_queues):
    error = only(run(KUMIKO_JOBS={"DEFAULT_QUEUE": "nope"}), "kumiko_jobs.E006")
    assert "KUMIKO_JOBS['DEFAULT_QUEUE'] is 'nope'" in error.msg
    assert "kumiko_jobs.E006" not in ids(run(KUMIKO_JOBS={"DEFAULT_QUEUE": "low"}))


def test_e006_rq_queues_without_default(jobs_on_queues):
    add_job(jobs_on_queues, "billing.sync")
    only(run(RQ_QUEUES={"low": django_settings.RQ_QUEUES["low"]}), "kumiko_jobs.E006")


def test_e006_names_at_most_five_jobs(jobs_on_queues):
    for n in range(8):
        add_job(jobs_on_queues, f"bulk.job{n}", queue="bulk")
    error = only(checks.check_settings(), "kumiko_jobs.E006")
    assert "bulk.job4" in error.msg and "bulk.job5" not in error.msg


def test_e006_checks_the_project_jobs():
    # The real registry: every test job uses the default queue.
    messages = run(RQ_QUEUES={"low": django_settings.RQ_QUEUES["low"]})
    error = only(messages, "kumiko_jobs.E006")
    assert "Queue 'default' used by " in error.msg


# --- E007 scheduler class, W001 worker class --------------------------------------------------


@pytest.mark.parametrize(
    "scheduler",
    [None, "rq_scheduler.Scheduler", "django_rq.queues.DjangoScheduler", "no.such.Scheduler", 5],
)
def test_e007_scheduler_that_cannot_read_json(scheduler):
    error = only(run(RQ=rq_with(SCHEDULER_CLASS=scheduler)), "kumiko_jobs.E007")
    assert "would try to unpickle" in error.msg
    assert "'kumiko_jobs.transport.Scheduler'" in error.hint


@pytest.mark.parametrize(
    "scheduler",
    ["kumiko_jobs.transport.Scheduler", f"{__name__}.MyScheduler", MyScheduler, Scheduler],
)
def test_e007_quiet_for_kumiko_schedulers(scheduler):
    assert "kumiko_jobs.E007" not in ids(run(RQ=rq_with(SCHEDULER_CLASS=scheduler)))


@pytest.mark.parametrize(
    "worker",
    [None, "rq.worker.SimpleWorker", "rq.worker.Worker", "django_rq.workers.Worker", "x.Nope"],
)
def test_w001_worker_that_is_not_kumikos(worker):
    warning = only(run(RQ=rq_with(WORKER_CLASS=worker)), "kumiko_jobs.W001")
    assert warning.level == django_checks.WARNING
    assert "reads pickle" in warning.msg
    assert "'kumiko_jobs.worker.Worker'" in warning.hint


@pytest.mark.parametrize(
    "worker",
    [
        "kumiko_jobs.worker.Worker",
        "kumiko_jobs.worker.ForkingWorker",
        f"{__name__}.MyWorker",
        MyWorker,
    ],
)
def test_w001_quiet_for_kumiko_workers(worker):
    assert "kumiko_jobs.W001" not in ids(run(RQ=rq_with(WORKER_CLASS=worker)))


def test_no_rq_setting_at_all(settings):
    del settings.RQ
    assert sorted(ids(checks.check_settings())) == ["kumiko_jobs.E007", "kumiko_jobs.W001"]


# --- E011 messages must expire before retention deletes their runs ----------------------------


@pytest.mark.parametrize(
    "kumiko_jobs",
    [
        {"RETENTION_DAYS": 7},  # the default MESSAGE_MAX_AGE is exactly seven days: not less
        {"RETENTION_DAYS": 30, "MESSAGE_MAX_AGE": 30 * 24 * 3600},
        {"RETENTION_DAYS": 1, "MESSAGE_MAX_AGE": 90000},
    ],
)
def test_e008_message_max_age_not_below_retention(kumiko_jobs):
    error = only(run(KUMIKO_JOBS=kumiko_jobs), "kumiko_jobs.E011")
    assert error.level == django_checks.ERROR
    assert "MESSAGE_MAX_AGE" in error.msg and "RETENTION_DAYS" in error.msg
    assert "Lower MESSAGE_MAX_AGE below" in error.hint and "raise RETENTION_DAYS" in error.hint


@pytest.mark.parametrize(
    "kumiko_jobs",
    [
        {},  # seven days against thirty
        {"RETENTION_DAYS": 8},
        {"RETENTION_DAYS": 1, "MESSAGE_MAX_AGE": 86399},
        {"RETENTION_DAYS": 0, "MESSAGE_MAX_AGE": 10**9},  # history kept for ever
    ],
)
def test_e008_quiet_when_messages_expire_first(kumiko_jobs):
    assert "kumiko_jobs.E011" not in ids(run(KUMIKO_JOBS=kumiko_jobs))


@pytest.mark.parametrize("value", [0, -1, True, "7d", 1.5])
def test_message_max_age_must_be_a_positive_integer(value):
    messages = run(KUMIKO_JOBS={"MESSAGE_MAX_AGE": value})
    assert ids(messages) == ["kumiko_jobs.E001"]
    assert "MESSAGE_MAX_AGE" in messages[0].msg and ">= 1" in messages[0].msg


# --- W006: Redis behind Sentinel ---------------------------------------------------------------


def _sentinel_queues(**extra: Any) -> dict[str, Any]:
    base = {"SENTINELS": [("127.0.0.1", 26379)], "MASTER_NAME": "main", "DB": 0}
    return {
        name: {k: v for k, v in cfg.items() if k != "URL"} | base | extra
        for name, cfg in django_settings.RQ_QUEUES.items()
    }


def test_w006_sentinel_without_a_socket_timeout():
    with override_settings(RQ_QUEUES=_sentinel_queues()):
        found = checks.check_redis_sentinel()
    assert sorted(m.msg.split("'")[1] for m in found) == sorted(django_settings.RQ_QUEUES)
    assert {m.id for m in found} == {"kumiko_jobs.W006"}
    assert "SOCKET_TIMEOUT" in str(found[0].hint)


def test_w006_quiet_with_a_socket_timeout_and_without_sentinel():
    with override_settings(RQ_QUEUES=_sentinel_queues(SOCKET_TIMEOUT=2)):
        assert checks.check_redis_sentinel() == []
    assert checks.check_redis_sentinel() == []  # the test settings: plain URLs


# --- E018: queue names the fair dequeue's keys cannot tell apart ---------------------------------


def test_e018_a_queue_name_holding_colon_digits_colon() -> None:
    url = {"URL": "redis://127.0.0.1:6379/0", "SERIALIZER": "rq.serializers.JSONSerializer"}
    names = ["default", "default:0:held:x", "low:-1:a", "v2:x", "a:b:c", "reports:2025"]
    with override_settings(RQ_QUEUES={name: dict(url) for name in names}):
        found = checks.check_queue_names()
        assert "kumiko_jobs.E018" in ids(checks.check_settings())
    assert [m.id for m in found] == ["kumiko_jobs.E018"] * 2
    assert ["default:0:held:x" in found[0].msg, "low:-1:a" in found[1].msg] == [True, True]
    assert "Rename the queue" in (found[0].hint or "")
    assert not checks.check_queue_names()  # the test settings' own queues
