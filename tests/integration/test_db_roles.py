"""The second wall: tenant job bodies log in as their tenant's PostgreSQL role (DB_ROLES).

Every test runs real jobs through a real RQ worker on the real database; what a job could
reach is read back on a second connection (support.Observer) with the project's credentials.
Calibration: each way out is first shown to work with both walls down (DB_GUARD off, DB_ROLES
off), so that its failure with the roles on proves the roles stopped it.
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django_tenants.utils import tenant_context

from kumiko_jobs.core import session
from kumiko_jobs.guard.roles import connections as tenant_connections
from kumiko_jobs.guard.roles import names as role_names
from kumiko_jobs.guard.roles import privileges as role_grants
from kumiko_jobs.guard.roles import sync as role_sync
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import start_rqworker, work
from tests.guardapp import role_jobs, support

pytestmark = pytest.mark.usefixtures("live_db")

ROLES_LOG = {**settings.KUMIKO_JOBS, "DB_GUARD": "log", "DB_ROLES": True}
ROLES_ENFORCE = {**settings.KUMIKO_JOBS, "DB_GUARD": "enforce", "DB_ROLES": True}
NO_WALLS = {**settings.KUMIKO_JOBS, "DB_GUARD": "off", "DB_ROLES": False}


def _project_user() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT session_user")
        return str(cursor.fetchone()[0])


def test_the_body_logs_in_as_its_tenants_role(tenants, guard_data):
    run = support.run_for(tenants["t1"], role_jobs.role_whoami, ROLES_ENFORCE)
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    role = role_names.role_name(tenants["t1"].pk)
    assert support.findings("t1") == {"identity": f"{role}/{role}", "secrets": "t1-value"}
    # ... and the history was written with the project's own user, on its own connection.
    assert _project_user() != role


# --- raw driver: undoing the identity first, then reading t2 -----------------------------------


@pytest.mark.parametrize("case", sorted(role_jobs.UNDO_IDENTITY))
def test_calibration_the_raw_driver_reads_t2_without_walls(tenants, guard_data, case):
    run = support.run_for(
        tenants["t1"],
        role_jobs.undo_identity_then_read,
        NO_WALLS,
        case=case,
        project=_project_user(),
    )
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    assert support.findings("t1")["leaked"] == "t2-value"


@pytest.mark.parametrize("mode", [ROLES_LOG, ROLES_ENFORCE], ids=["log", "enforce"])
@pytest.mark.parametrize("case", sorted(role_jobs.UNDO_IDENTITY))
def test_the_raw_driver_cannot_undo_the_login_role(tenants, guard_data, observer, case, mode):
    run = support.run_for(
        tenants["t1"],
        role_jobs.undo_identity_then_read,
        mode,
        case=case,
        project=_project_user(),
    )
    assert run.status == RunStatus.FAILED
    assert run.error_type == "DatabaseAccessDenied", run.error_message
    assert "denied by PostgreSQL: permission denied for schema t2" in run.error_message
    assert run.attempts == 1
    findings = support.findings("t1")
    assert "leaked" not in findings
    assert findings["undo"].startswith("refused") or findings["undo"] == "accepted"
    assert observer.rows("SELECT label, value FROM t2.guardapp_secret") == [
        ("t2-secret", "t2-value")
    ]


def test_a_swallowed_permission_denied_still_fails_the_run(tenants, guard_data):
    """The job catches PostgreSQL's refusal and returns normally: the run is still failed."""
    run = support.run_for(tenants["t1"], role_jobs.swallow_denial, ROLES_LOG)
    assert support.findings("t1") == {"swallowed": "carried on"}
    assert run.status == RunStatus.FAILED
    assert run.error_type == "DatabaseAccessDenied"
    assert run.error_message.startswith("the job swallowed a database access denial")


# --- escape hatches switch identity -------------------------------------------------------------


def test_global_writes_run_as_the_tenants_writer_login_for_the_block(tenants, guard_data, observer):
    """Not the project user: the writer login holds the tenant's own privileges and writes on
    the shared tables, nothing on other tenants (test_db_roles_leftovers has the raw routes)."""
    run = support.run_for(tenants["t1"], role_jobs.role_add_plan, ROLES_LOG, name="added")
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    role = role_names.role_name(tenants["t1"].pk)
    writer = role_names.writer_name(tenants["t1"].pk)
    assert support.findings("t1") == {
        "inside_global_writes": f"{writer}/{writer}",
        "after_global_writes": f"{role}/{role}",
    }
    assert ("added", "3.00") in support.plans()


def test_without_global_writes_a_shared_write_is_refused_by_postgresql(tenants, guard_data):
    run = support.run_for(tenants["t1"], role_jobs.write_shared_unguarded, ROLES_LOG)
    assert run.status == RunStatus.FAILED
    assert run.error_type == "DatabaseAccessDenied"
    assert "permission denied for table catalog_plan" in run.error_message
    assert support.plans() == [("basic", "10.00"), ("pro", "25.00")]


def test_cross_tenant_reads_use_the_other_tenants_role_read_only(tenants, guard_data):
    run = support.run_for(tenants["t1"], role_jobs.read_other_tenant, ROLES_LOG, schema="t2")
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    t1_role = role_names.role_name(tenants["t1"].pk)
    t2_reader = role_names.reader_name(tenants["t2"].pk)
    assert support.findings("t1") == {
        "read": "t2-value",
        "identity_in_block": f"{t2_reader}/{t2_reader}",
        "identity_after": f"{t1_role}/{t1_role}",
    }


def test_cross_tenant_reads_cannot_write_even_past_the_classifier(tenants, guard_data):
    run = support.run_for(
        tenants["t1"], role_jobs.read_other_tenant, ROLES_LOG, schema="t2", write_too=True
    )
    assert run.status == RunStatus.FAILED
    assert "read-only transaction" in run.error_message, run.error_message
    assert support.secrets("t2") == [("t2-secret", "t2-value")]


def test_system_jobs_run_as_the_project_user(live_db, guard_data):
    from kumiko_jobs.enqueueing.submit import enqueue

    with override_settings(KUMIKO_JOBS=ROLES_ENFORCE):
        handle = enqueue(role_jobs.role_system_identity)
        work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    project = _project_user()
    assert {(project, "0.00"), ("sys-same", "0.00")} <= set(support.plans())


def test_a_connection_with_the_project_credentials_opened_in_the_body_is_refused(
    tenants, guard_data
):
    run = support.run_for(tenants["t1"], role_jobs.open_project_connection, ROLES_LOG)
    assert run.status == RunStatus.FAILED
    assert run.error_type == "DatabaseAccessDenied"
    assert "with the project's credentials was opened during the run" in run.error_message
    assert "leaked" not in support.findings("t1")


# --- tenant lifecycle ---------------------------------------------------------------------------


def _role_exists(observer: support.Observer, role: str) -> bool:
    return bool(observer.rows("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)))


def _e012() -> list[Any]:
    from kumiko_jobs.checks import check_db_roles_in_step

    return [m for m in check_db_roles_in_step(databases=["default"]) if m.id == "kumiko_jobs.E012"]


def test_tenant_lifecycle_create_run_migrate_repair_delete(live_db, observer):
    from example_project.customers.models import Client

    with override_settings(KUMIKO_JOBS=ROLES_ENFORCE):
        tenant = Client(schema_name="t_life", name="Lifecycle")
        tenant.save()  # creates and migrates the schema: the role comes with it
        role = role_names.role_name(tenant.pk)
        try:
            assert _role_exists(observer, role)
            assert role_sync.out_of_date() == [] and _e012() == []

            # Runs of the new tenant work at once, as its role.
            run = support.run_for(tenant, role_jobs.role_whoami, ROLES_ENFORCE)
            assert run.status == RunStatus.SUCCEEDED, run.error_message
            assert support.findings("t_life")["identity"] == f"{role}/{role}"

            # A grant revoked by hand: found by the check (naming the command), refused by
            # PostgreSQL, repaired by a migration of the schema and by the command.
            revoke = f'REVOKE SELECT ON "t_life".guardapp_secret FROM "{role}"'
            observer.rows(revoke)
            assert role_sync.out_of_date() == ["t_life"]
            (error,) = _e012()
            assert "t_life" in error.msg and "manage.py kumiko_jobs roles" in error.hint
            run = support.run_for(tenant, role_jobs.role_whoami, ROLES_ENFORCE)
            assert run.status == RunStatus.FAILED
            assert "permission denied for table guardapp_secret" in run.error_message

            call_command("migrate_schemas", schema_name="t_life", interactive=False, verbosity=0)
            assert role_sync.out_of_date() == []

            observer.rows(revoke)
            observer.rows(f'GRANT CREATE ON SCHEMA "t_life" TO "{role}"')  # too much, by hand
            call_command("kumiko_jobs", "roles", stdout=StringIO())
            assert role_sync.out_of_date() == []
            assert not observer.value(
                "SELECT has_schema_privilege(%s, 't_life', 'CREATE')", (role,)
            )
            run = support.run_for(tenant, role_jobs.role_whoami, ROLES_ENFORCE)
            assert run.status == RunStatus.SUCCEEDED, run.error_message

            # A table created later by the project user (a migration) is the tenant's at once.
            with connection.cursor() as cursor:  # the project user, as migrate_schemas would
                cursor.execute('CREATE TABLE "t_life".later_table (id serial PRIMARY KEY)')
            assert observer.value(
                "SELECT has_table_privilege(%s, 't_life.later_table', 'INSERT')", (role,)
            )
            assert observer.value(
                "SELECT has_sequence_privilege(%s, 't_life.later_table_id_seq', 'USAGE')",
                (role,),
            )
        finally:
            tenant_connections.close_all()
            tenant.delete(force_drop=True)
        assert not _role_exists(observer, role)


def test_the_command_drops_roles_of_deleted_tenants_and_only_ours(live_db, observer):
    prefix = role_names.prefix()
    orphan = f"{prefix}_t999999"
    foreign = "kj_0000000000_t1"  # another database's (another suite's) name space
    observer.rows(f'CREATE ROLE "{orphan}" LOGIN')
    created_foreign = not _role_exists(observer, foreign)
    if created_foreign:
        observer.rows(f'CREATE ROLE "{foreign}"')
    try:
        assert f"role {orphan} (no such tenant)" in role_sync.out_of_date()
        out = StringIO()
        call_command("kumiko_jobs", "roles", stdout=out)
        assert orphan in out.getvalue()
        assert not _role_exists(observer, orphan)
        assert _role_exists(observer, foreign)
    finally:
        observer.rows(f'DROP ROLE IF EXISTS "{orphan}"')
        if created_foreign:
            observer.rows(f'DROP ROLE IF EXISTS "{foreign}"')


def test_tenant_roles_hold_only_what_the_docs_list(tenants, observer):
    role = role_names.role_name(tenants["t1"].pk)
    group = role_names.group_name()
    row = observer.rows(
        "SELECT rolsuper, rolcreaterole, rolcreatedb, rolcanlogin, rolinherit, rolbypassrls, "
        "rolreplication FROM pg_roles WHERE rolname = %s",
        (role,),
    )
    assert row == [(False, False, False, True, True, False, False)]
    assert observer.value("SELECT pg_has_role(%s, %s, 'MEMBER')", (role, group))

    def can(privilege: str, target: str) -> bool:
        return bool(
            observer.value(f"SELECT has_table_privilege(%s, %s, '{privilege}')", (role, target))
        )

    assert can("SELECT", "t1.guardapp_secret") and can("DELETE", "t1.guardapp_secret")
    assert not can("TRUNCATE", "t1.guardapp_secret")
    assert not observer.value("SELECT has_schema_privilege(%s, 't2', 'USAGE')", (role,))
    assert not observer.value("SELECT has_schema_privilege(%s, 't1', 'CREATE')", (role,))
    assert can("SELECT", "public.catalog_plan") and not can("INSERT", "public.catalog_plan")
    assert can("SELECT", "public.customers_client") and not can("UPDATE", "public.customers_client")
    assert not can("SELECT", "public.kumiko_jobs_jobrun")
    # The shared grants are the group's, once: no tenant role is named on a shared table.
    assert not observer.rows(
        "SELECT 1 FROM information_schema.role_table_grants WHERE table_schema = 'public' "
        "AND grantee LIKE %s AND grantee <> %s",
        (role_names.prefix() + r"\_t%", group),
    )


# --- the pool and the cost ----------------------------------------------------------------------


@pytest.mark.one_slot
def test_a_warm_tenant_connection_costs_no_extra_statement(tenants):
    """Statements sent to PostgreSQL (psycopg's cursor, every connection) per run, warm."""
    import psycopg

    counted: list[str] = []
    original = psycopg.Cursor.execute

    def counting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        counted.append(str(query)[:40])
        return original(self, query, *args, **kwargs)

    # A tenant login's reset is sent past psycopg's cursor, without waiting (core.session).
    send_reset = session.send_reset

    def counting_reset(raw: Any, statement: str) -> None:
        counted.append(statement[:40])
        send_reset(raw, statement)

    def statements_of_a_warm_run(mode: dict[str, Any]) -> int:
        support.run_for(tenants["t1"], role_jobs.role_whoami, mode)  # warm: connected, schema known
        counted.clear()
        psycopg.Cursor.execute = counting  # type: ignore[method-assign]
        session.send_reset = counting_reset
        try:
            connects = tenant_connections.connects()
            run = support.run_for(tenants["t1"], role_jobs.role_whoami, mode)
        finally:
            psycopg.Cursor.execute = original  # type: ignore[method-assign]
            session.send_reset = send_reset
        assert run.status == RunStatus.SUCCEEDED, run.error_message
        assert tenant_connections.connects() == connects  # no new connection
        return len(counted)

    with_roles = statements_of_a_warm_run(ROLES_ENFORCE)
    without = statements_of_a_warm_run({**ROLES_ENFORCE, "DB_ROLES": False})
    # The run's statements plus whatever the test does around it: with roles, one fewer (the
    # tenant's session keeps its search path, which the reset after every run sets again).
    assert with_roles == without - 1


@pytest.mark.one_slot
def test_the_pool_keeps_one_connection_per_tenant_up_to_its_size(tenants):
    order = ["t1", "t2", "t3", "t1", "t2", "t3"]

    def connects_for(size: int) -> int:
        tenant_connections.close_all()
        before = tenant_connections.connects()
        mode = {**ROLES_ENFORCE, "DB_ROLE_POOL_SIZE": size}
        for schema in order:
            run = support.run_for(tenants[schema], role_jobs.role_whoami, mode)
            assert run.status == RunStatus.SUCCEEDED, run.error_message
        return tenant_connections.connects() - before

    assert connects_for(3) == 3  # each tenant once
    assert connects_for(2) == 6  # LRU of two over three tenants in turn: every run reconnects


# --- the threat model's objects: views, SECURITY DEFINER functions, non-model tables ------------


def _as_project_user(statement: str) -> None:
    """Objects the project user owns, as its migrations or a developer would create them."""
    connection.set_schema_to_public()
    with connection.cursor() as cursor:
        cursor.execute(statement)


@pytest.fixture
def planted_objects() -> Iterator[None]:
    _as_project_user(
        "CREATE TABLE public.kj_cache_table (cache_key text PRIMARY KEY, value text);"
        "INSERT INTO public.kj_cache_table VALUES ('k', 'cached-secret');"
        "CREATE VIEW public.kj_leak_view AS SELECT value FROM t2.guardapp_secret;"
        "CREATE FUNCTION public.kj_definer_leak() RETURNS text LANGUAGE sql SECURITY DEFINER "
        "AS 'SELECT value FROM t2.guardapp_secret LIMIT 1';"
    )
    yield
    _as_project_user(
        "DROP TABLE public.kj_cache_table; DROP VIEW public.kj_leak_view; "
        "DROP FUNCTION public.kj_definer_leak()"
    )


@pytest.mark.parametrize(
    ("statement", "refusal"),
    [
        ("SELECT value FROM public.kj_cache_table", "permission denied for table kj_cache_table"),
        ("SELECT value FROM public.kj_leak_view", "permission denied for view kj_leak_view"),
        ("SELECT count(*) FROM public.kumiko_jobs_jobrun", "permission denied for table"),
    ],
)
def test_non_model_tables_views_and_history_are_not_readable(
    tenants, guard_data, planted_objects, statement, refusal
):
    calibration = support.run_for(tenants["t1"], role_jobs.raw_read, NO_WALLS, statement=statement)
    assert calibration.status == RunStatus.SUCCEEDED, calibration.error_message
    support.clean()
    support.seed()
    run = support.run_for(tenants["t1"], role_jobs.raw_read, ROLES_LOG, statement=statement)
    assert run.status == RunStatus.FAILED
    assert run.error_type == "DatabaseAccessDenied"
    assert refusal in run.error_message, run.error_message
    assert "read" not in support.findings("t1")


def test_a_security_definer_function_is_outside_the_walls_unless_revoked(
    tenants, guard_data, planted_objects, observer
):
    """docs/guard.md, "What is outside both walls": PostgreSQL grants EXECUTE to PUBLIC, and a
    SECURITY DEFINER function runs with its owner's (the project user's) rights."""
    call = "SELECT public.kj_definer_leak()"
    run = support.run_for(tenants["t1"], role_jobs.raw_read, ROLES_LOG, statement=call)
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    assert support.findings("t1") == {"read": "t2-value"}  # the documented way out

    _as_project_user("REVOKE EXECUTE ON FUNCTION public.kj_definer_leak() FROM PUBLIC")
    support.clean()
    support.seed()
    run = support.run_for(tenants["t1"], role_jobs.raw_read, ROLES_LOG, statement=call)
    assert run.status == RunStatus.FAILED
    assert "permission denied for function kj_definer_leak" in run.error_message


# --- both workers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "worker_class", ["kumiko_jobs.worker.Worker", "kumiko_jobs.worker.ForkingWorker"]
)
def test_both_workers_run_the_body_as_the_tenant_role(tenants, guard_data, worker_class):
    from tests.conftest import start_rqworker

    with tenant_context(tenants["t1"]):
        who = role_jobs.role_whoami.enqueue()
        undo = role_jobs.undo_identity_then_read.enqueue(
            case="set_config_role", project=_project_user()
        )
    proc = start_rqworker("default", "--burst", "--worker-class", worker_class)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    connection.set_schema_to_public()
    role = role_names.role_name(tenants["t1"].pk)
    assert JobRun.objects.get(pk=who.run_id).status == RunStatus.SUCCEEDED, out
    denied = JobRun.objects.get(pk=undo.run_id)
    assert (denied.status, denied.error_type) == (RunStatus.FAILED, "DatabaseAccessDenied")
    findings = support.findings("t1")
    assert findings["identity"] == f"{role}/{role}"
    assert "leaked" not in findings


def _start_warning() -> str:
    """The roles' warning a long-running ``manage.py rqworker`` logs at its start ("" once it
    has started without one), the worker then stopped."""
    worker = start_rqworker("low", "--name", f"roles-{uuid.uuid4().hex[:8]}")
    lines: queue.Queue[str] = queue.Queue()
    assert worker.stdout is not None
    threading.Thread(target=lambda: [lines.put(x) for x in worker.stdout], daemon=True).start()
    said = ""
    try:
        while True:
            line = lines.get(timeout=120)  # a worker that never starts fails the test here
            if "DB_ROLES:" in line:
                said = line
                break
            if "Listening on" in line:
                break  # started, and said nothing
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    return said


def test_a_run_whose_role_is_missing_fails_and_the_command_brings_it_back(
    tenants, guard_data, observer
):
    """docs/guard.md, "Who runs what": the login fails, the run fails like any error of its
    body (never silently as the project user), and E012 names the tenant."""
    role = role_names.role_name(tenants["t3"].pk)
    tenant_connections.close_all()
    with connection.cursor() as cursor:
        role_grants.drop_role(cursor, role)
    try:
        assert "t3" in role_sync.out_of_date()
        # A long-running `manage.py rqworker` says so at its start, before any run fails.
        said = _start_warning()
        assert "(t3)" in said and "`python manage.py kumiko_jobs roles`" in said
        run = support.run_for(tenants["t3"], role_jobs.role_whoami, ROLES_ENFORCE)
        assert run.status == RunStatus.FAILED
        assert run.error_type == "OperationalError"
        # The fix first (`kumiko_jobs runs` shows an error's first 60 characters), then why.
        assert run.error_message.startswith(f"the tenant's database role {role} is missing")
        assert "run `manage.py kumiko_jobs roles`" in run.error_message
        assert f'role "{role}" does not exist' in run.error_message
        assert "identity" not in support.findings("t3")
    finally:
        call_command("kumiko_jobs", "roles", stdout=StringIO())
    assert role_sync.out_of_date() == []
    run = support.run_for(tenants["t3"], role_jobs.role_whoami, ROLES_ENFORCE)
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    assert _start_warning() == ""  # nothing to say once the roles are back


def test_ddl_fails_as_the_tenant_role_even_in_its_own_schema(tenants, guard_data, observer):
    """docs/guard.md, "Who runs what": schema changes belong to migrate_schemas."""
    statement = "CREATE TABLE t1.kj_made_by_a_job (id int)"
    run = support.run_for(tenants["t1"], role_jobs.raw_read, ROLES_LOG, statement=statement)
    assert run.status == RunStatus.FAILED
    assert "permission denied for schema t1" in run.error_message, run.error_message
    assert not observer.rows(
        "SELECT 1 FROM pg_tables WHERE schemaname = 't1' AND tablename = 'kj_made_by_a_job'"
    )


def test_e012_names_the_atomic_success_function_when_the_group_lost_it(tenants, observer):
    """A deploy that migrated 0011 but did not run the roles command: every atomic run under
    DB_ROLES would fail at its end. The check names the function; the command grants it."""
    from kumiko_jobs.core.db import ATOMIC_FUNCTION, ATOMIC_SIGNATURE

    function = f"public.{ATOMIC_FUNCTION}{ATOMIC_SIGNATURE}"
    group = role_names.group_name()
    granted = "SELECT has_function_privilege(%s, %s, 'EXECUTE')"
    assert observer.value(granted, (group, function)) is True
    assert role_sync.out_of_date() == []
    observer.rows(f'REVOKE EXECUTE ON FUNCTION {function} FROM "{group}"')
    try:
        assert observer.value(granted, (group, function)) is False
        assert role_sync.out_of_date() == [
            f"function {function} (the tenants' group may not execute it)"
        ]
        (error,) = _e012()
        assert ATOMIC_FUNCTION in error.msg
    finally:
        call_command("kumiko_jobs", "roles", stdout=StringIO())
    assert observer.value(granted, (group, function)) is True
    assert role_sync.out_of_date() == []
