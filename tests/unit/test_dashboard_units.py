"""The dashboard's pure parts: time buckets, the filters' SQL, metric labels."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kumiko_jobs.admin.dashboard import metrics
from kumiko_jobs.history import stats


def test_buckets_end_with_the_step_now_is_in() -> None:
    now = datetime(2026, 12, 3, 17, 42, 31, tzinfo=UTC)
    hour, day, week = stats.WINDOWS["hour"], stats.WINDOWS["day"], stats.WINDOWS["week"]
    assert stats.bucket_start(hour, now) == datetime(2026, 12, 3, 16, 43, tzinfo=UTC)
    last = stats.bucket_start(hour, now) + 59 * hour.step
    assert last <= now < last + hour.step
    assert stats.bucket_start(day, now) == datetime(2026, 12, 2, 17, 45, tzinfo=UTC)
    assert stats.bucket_start(week, now) == datetime(2026, 11, 26, 18, 0, tzinfo=UTC)
    for window in stats.WINDOWS.values():
        assert window.span / window.step == int(window.span / window.step)
        assert stats.bucket_start(window, now) + window.span - now < window.step + timedelta(0)


def test_scope_conditions_are_parameters_never_text() -> None:
    assert stats.Scope().where() == ("", [])
    sql, params = stats.Scope(queue="low", job="a'; DROP TABLE x; --", tenant="t1'").where()
    # A tenant's runs and the system runs its runs started (flow_schema).
    assert sql == (
        " AND queue = %s AND job_name = %s AND (schema_name = %s OR schema_name = '' "
        "AND flow_schema = %s AND flow_schema <> '')"
    )
    assert params == ["low", "a'; DROP TABLE x; --", "t1'", "t1'"]
    # "" is the system's own runs (no tenant started them), None every tenant.
    assert stats.Scope(tenant="").where() == (" AND schema_name = '' AND flow_schema = ''", [])


def test_metric_labels_are_escaped() -> None:
    assert metrics._label('we"ird\\q\nx') == '{queue="we\\"ird\\\\q\\nx"}'
