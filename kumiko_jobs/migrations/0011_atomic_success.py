# The function an atomic run records its success with, from inside its own transaction on the
# body's connection (issue 15; docs/reliability.md, "Exactly once for database-only jobs").
#
# SECURITY DEFINER, owned by the project user who runs the migration: under DB_ROLES the body
# logs in as its tenant's role, which holds nothing on kumiko's tables; this function is the
# one narrow door. It updates one row, a running run of a schema the caller's login may use,
# and only from the transaction the runner opened for the body (the xid the runner read before
# the body ran). EXECUTE is revoked from PUBLIC; the roles command grants it to the tenants'
# group (db_roles.ensure_group).
#
# Numbered 0011: 0010 is another change of the same issue; the lead orders them on merge.

from django.db import migrations

FUNCTION = "kumiko_jobs_atomic_success"
SIGNATURE = "(uuid, integer, xid8, timestamptz, jsonb)"

BODY = """
CREATE OR REPLACE FUNCTION {schema}.kumiko_jobs_atomic_success(
    p_run uuid, p_attempt integer, p_xid xid8, p_finished timestamptz, p_result jsonb
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_schema text;
BEGIN
    -- The run's commit waits for the WAL flush, whatever the body set for its transaction
    -- (HISTORY_SYNCHRONOUS_COMMIT is about kumiko's own bookkeeping, never this commit).
    PERFORM set_config('synchronous_commit', 'on', true);
    IF pg_current_xact_id_if_assigned() IS DISTINCT FROM p_xid THEN
        RAISE EXCEPTION 'kumiko_jobs: atomic run % is no longer in the transaction the runner '
            'opened for it: the job ended it itself (COMMIT or ROLLBACK through the driver)',
            p_run USING ERRCODE = 'KJ001';
    END IF;
    SELECT schema_name INTO v_schema FROM {schema}.kumiko_jobs_jobrun
        WHERE run_id = p_run FOR UPDATE;
    -- Under DB_ROLES the login is the tenant's role: only its own schema's runs.
    IF v_schema IS NULL OR v_schema = ''
            OR NOT has_schema_privilege(session_user, v_schema, 'USAGE') THEN
        RAISE EXCEPTION 'kumiko_jobs: run % is not a run of a schema this login may use', p_run
            USING ERRCODE = 'KJ002';
    END IF;
    UPDATE {schema}.kumiko_jobs_jobrun
        SET status = 'succeeded', finished_at = p_finished, error_type = '',
            error_message = '', result = p_result
        WHERE run_id = p_run AND status = 'running' AND attempts = p_attempt;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'kumiko_jobs: run % no longer runs attempt %', p_run, p_attempt
            USING ERRCODE = 'KJ003';
    END IF;
END
$fn$;
REVOKE ALL ON FUNCTION {schema}.kumiko_jobs_atomic_success{signature} FROM PUBLIC;
"""


def _schema(schema_editor):  # type: ignore[no-untyped-def]
    from kumiko_jobs import conf

    return schema_editor.quote_name(conf.public_schema_name())


def _run(schema_editor, statement):  # type: ignore[no-untyped-def]
    # Without parameters: the function's RAISE formats use '%', which psycopg would read as
    # placeholders.
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(statement)


def create(apps, schema_editor):  # type: ignore[no-untyped-def]
    _run(schema_editor, BODY.format(schema=_schema(schema_editor), signature=SIGNATURE))


def drop(apps, schema_editor):  # type: ignore[no-untyped-def]
    _run(schema_editor, f"DROP FUNCTION IF EXISTS {_schema(schema_editor)}.{FUNCTION}{SIGNATURE}")


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0010_history_indexes"),
    ]

    operations = [migrations.RunPython(create, drop)]
