"""The scheduler (transport) reaches the cron domain only through the hooks apps.ready installs."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from kumiko_jobs import transport
from kumiko_jobs.definition.options import build_definition
from kumiko_jobs.enqueueing import schedules
from kumiko_jobs.transport import keys as transport_keys
from kumiko_jobs.transport import scheduler


def test_app_start_up_installs_the_cron_domain() -> None:
    assert transport.cron_hooks() is schedules.CRON_HOOKS


def test_without_hooks_the_scheduler_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    # The module that owns the hooks (and that cron_hooks() reads), not the transport's face.
    monkeypatch.setattr(scheduler, "_cron_hooks", None)
    with pytest.raises(ImproperlyConfigured, match=r"INSTALLED_APPS.*KumikoJobsConfig\.ready"):
        transport.cron_hooks()


def test_cron_entries_keep_their_redis_prefix() -> None:
    # Stored in Redis by every deployed scheduler: the prefix never changes.
    assert transport_keys.CRON_PREFIX == "kj-cron-"
    nightly = build_definition(
        _nightly, {"name": "billing.nightly", "system": True, "cron": "0 3 * * *"}
    )
    assert schedules.schedule_id(nightly) == "kj-cron-billing_nightly"


def _nightly(ctx: Any) -> None:
    pass
