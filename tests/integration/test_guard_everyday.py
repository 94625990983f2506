"""Everyday SQL keeps working under the DB guard, on the real PostgreSQL.

The guard is installed exactly as the ``db_guard`` step installs it for a job body
(``GuardWrapper`` on ``execute_wrapper`` of the connection, enforce mode, no grant open) in
tenant t1, and ordinary ORM querysets, raw SQL and Django's introspection run through it and
through PostgreSQL. A spy inside the guard records what reached the server, so the test also
proves the statements were executed (not only classified), and that they were many.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.contrib.postgres.aggregates import ArrayAgg, JSONBAgg
from django.db import connection, transaction
from django.db.models import Count, Exists, F, OuterRef, Q, Sum, Value, Window

try:  # Django 6: a core aggregate; Django 5.2: PostgreSQL's contrib module
    from django.db.models import StringAgg  # type: ignore[attr-defined]
except ImportError:
    from django.contrib.postgres.aggregates import StringAgg  # type: ignore[no-redef]
from django.db.models.functions import Coalesce, JSONObject, Lower, Now, RowNumber, TruncMonth
from django_tenants.utils import tenant_context

from example_project.billing.models import ActivityLog, Customer, Invoice
from kumiko_jobs.core.envelope import Envelope, new_run_id
from kumiko_jobs.core.exceptions import DatabaseAccessDenied
from kumiko_jobs.definition.registry import registry
from kumiko_jobs.guard.wrapper import GuardWrapper
from kumiko_jobs.history import audit
from kumiko_jobs.run.state import RunState

pytestmark = pytest.mark.usefixtures("live_db")


def _state(tenant: Any) -> RunState:
    definition = registry.get("guardapp.attack")
    envelope = Envelope(
        job=definition.name, schema=tenant.schema_name, kwargs={}, run_id=new_run_id()
    )
    return RunState.new(envelope, definition, tenant=tenant)


@contextlib.contextmanager
def guarded(tenant: Any) -> Iterator[tuple[RunState, list[str]]]:
    """Tenant context + the guard as the step installs it + a spy of what reached PostgreSQL."""
    state = _state(tenant)
    seen: list[str] = []

    def spy(execute: Callable[..., Any], sql: Any, params: Any, many: bool, ctx: Any) -> Any:
        seen.append(str(sql))
        return execute(sql, params, many, ctx)

    with (
        tenant_context(tenant),
        connection.execute_wrapper(
            GuardWrapper(
                state.watch, enforce=True, report_use=functools.partial(audit.record_use, state)
            )
        ),
        connection.execute_wrapper(spy),  # inner: sees only what the guard let through
    ):
        yield state, seen


def _orm_everyday() -> None:
    customer = Customer.objects.create(name="Ada", email="ada@example.com")
    Customer.objects.get_or_create(name="Bob", defaults={"email": "bob@example.com"})
    Customer.objects.update_or_create(name="Bob", defaults={"email": "bob@example.org"})
    Invoice.objects.bulk_create(
        [Invoice(number=f"E-{i}", amount=Decimal(i)) for i in range(1, 4)],
        update_conflicts=True,
        unique_fields=["number"],
        update_fields=["amount"],
    )  # INSERT ... ON CONFLICT DO UPDATE
    Invoice.objects.bulk_create([Invoice(number="E-1", amount=1)], ignore_conflicts=True)
    inv = Invoice.objects
    list(inv.filter(number__in=["E-1", "E-2"]).values_list("id", flat=True))
    list(inv.filter(number__icontains="e").order_by("-amount")[:2])
    list(inv.filter(Q(amount__gt=1) | ~Q(number="E-3")).values("id"))
    list(inv.filter(amount__gt=F("sync_attempts") + 1).only("id"))
    list(inv.filter(synced_at__isnull=True, number__iregex="^e-"))
    list(inv.annotate(m=TruncMonth("synced_at")).values("m").annotate(c=Count("id")))
    list(inv.annotate(r=Window(RowNumber(), order_by=F("amount").desc())).values("id", "r"))
    list(inv.annotate(a=ArrayAgg("number"), j=JSONBAgg("number")).values("a", "j"))
    list(inv.values("number").annotate(s=StringAgg("number", Value(","))))
    list(inv.annotate(n=Lower("number"), c=Coalesce("synced_at", Now())).values("n", "c"))
    list(inv.filter(Exists(Customer.objects.filter(name=OuterRef("number")))))
    inv.aggregate(total=Sum("amount"), n=Count("id"))
    inv.filter(number="E-1").exists()
    inv.count()
    inv.filter(number="E-3").update(sync_attempts=F("sync_attempts") + 1)
    with transaction.atomic():
        list(inv.select_for_update(skip_locked=True).filter(amount__gte=1))
        list(inv.select_for_update(of=("self",), no_key=True).filter(pk__gte=0))
    inv.filter(number="E-3").delete()
    ActivityLog.objects.create(job="everyday", message="x")
    list(ActivityLog.objects.filter(created_at__lte=Now()).order_by("-id")[:5])
    list(ActivityLog.objects.raw("SELECT * FROM billing_activitylog WHERE job = %s", ["x"]))
    group = Group.objects.create(name="staff")
    user = User.objects.create_user("everyday-user")
    user.groups.add(group)
    list(User.objects.filter(groups__name="staff").prefetch_related("groups"))
    user.delete()
    group.delete()
    customer.delete()
    # JSON lookups (the ? and @> operators). kumiko's own JobRun.payload was used here until
    # issue 22 refused kumiko's tables to tenant runs: a JSON value built from a tenant table.
    json = inv.annotate(j=JSONObject(n="number"))
    list(json.filter(j__has_key="n").values("id")[:1])
    list(json.filter(j__contains={"n": "E-1"}).values("id")[:1])


RAW_EVERYDAY: list[tuple[str, Any]] = [
    ("SELECT id FROM billing_invoice WHERE id = ANY(%s)", [[1, 2, 3]]),
    ("SELECT jsonb_build_object('a', %s::int) ->> 'a', to_jsonb(%s::text)", [1, "x"]),
    ("SELECT * FROM jsonb_each_text(%s::jsonb) AS j(k, v)", ['{"a": "b"}']),
    ("SELECT nextval('billing_activitylog_id_seq')", None),
    ("SELECT pg_advisory_xact_lock(hashtext(%s))", ["everyday"]),
    ("SELECT pg_try_advisory_xact_lock(7, hashtext(%s))", ["everyday"]),
    ("EXPLAIN SELECT id FROM billing_invoice", None),
    ("EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM billing_invoice", None),
    ("SHOW search_path", None),
    ("SHOW TimeZone", None),
    ("SELECT current_setting('TimeZone'), now(), gen_random_uuid(), random()", None),
    ("SELECT to_tsvector('english', %s) @@ plainto_tsquery('english', %s)", ["cats", "cat"]),
    ("SELECT date_trunc('month', now() AT TIME ZONE 'UTC'), extract(epoch FROM now())", None),
    ("SELECT * FROM generate_series(1, 3) AS g(n)", None),
    ("SELECT '100%%' LIKE %s", ["100%"]),
    ("SELECT '100%' LIKE '100%'", None),
    ("SELECT 'billing_invoice'::regclass::oid", None),
]


def test_everyday_statements_pass_the_guard_and_run(tenants: dict[str, Any]) -> None:
    with guarded(tenants["t1"]) as (state, seen):
        _orm_everyday()
        with transaction.atomic(), connection.cursor() as cursor:
            for sql, params in RAW_EVERYDAY:
                cursor.execute(sql, params)
                cursor.fetchall()
    assert state.watch.violations == []
    distinct = {s for s in seen if not s.startswith("SET search_path")}
    assert len(distinct) >= 40, sorted(distinct)
    for sql, _ in RAW_EVERYDAY:
        assert sql in seen


def test_django_introspection_passes_the_guard(tenants: dict[str, Any]) -> None:
    introspection = connection.introspection
    with guarded(tenants["t1"]) as (state, seen), connection.cursor() as cursor:
        tables = {t.name for t in introspection.get_table_list(cursor)}
        assert "billing_invoice" in tables
        description = introspection.get_table_description(cursor, "billing_invoice")
        constraints = introspection.get_constraints(cursor, "billing_invoice")
        sequences = introspection.get_sequences(cursor, "billing_invoice")
        relations = introspection.get_relations(cursor, "auth_user_groups")
        primary_key = introspection.get_primary_key_column(cursor, "billing_invoice")
    assert state.watch.violations == []
    assert {c.name for c in description} >= {"id", "number", "amount"}
    assert any(c["unique"] for c in constraints.values())
    assert sequences and primary_key == "id"
    assert relations["group_id"][:2] == ("id", "auth_group")
    assert any("pg_catalog" in s or "pg_class" in s for s in seen)


def test_denied_statements_never_reach_postgresql(tenants: dict[str, Any]) -> None:
    """Calibration of the spy: what the guard refuses is absent from what it saw."""
    refused = [
        "SELECT histogram_bounds FROM pg_stats",
        "UPDATE pg_settings SET setting = 't2' WHERE name = 'search_path'",
        "SELECT setval('t2.guardapp_secret_id_seq', 1000)",
        "SELECT * FROM billing_invoice WHERE number = '%s'",
    ]
    with guarded(tenants["t1"]) as (state, seen), connection.cursor() as cursor:
        for sql in refused:
            with pytest.raises(DatabaseAccessDenied):
                cursor.execute(sql, ["x"] if "%s" in sql else None)
        cursor.execute("SELECT 1")
    assert not set(refused) & set(seen)
    assert "SELECT 1" in seen
    assert len(state.watch.violations) == len(refused)
