# Nothing outlives a run, and the atomic success function (issue 22).
#
# * AdmissionLock: kumiko's admission lock becomes a row lock on this table (one row per job and
#   tenant, enqueueing/admission.py). The advisory lock it replaces could be taken, and held for
#   as long as a pooled session lived, by any session, a tenant role's on another tenant's key
#   included; tenant roles hold no privilege on kumiko's tables.
# * JobRun.atomic_key: the SHA-256 of the secret the runner holds for the atomic attempt it
#   runs, written before the body's transaction opens (run/steps/atomic.py). db_default too: a
#   process of the previous release inserts rows without this column.
# * kumiko_jobs_atomic_success with the attempt's key as a sixth argument, replacing 0011's
#   five-argument function, which any tenant login could call with its own
#   pg_current_xact_id() to mark any running run of its tenant succeeded with a result of its
#   choice. Whoever could execute the old function may execute the new one (the roles command
#   grants it to the tenants' group anyway); the old one is dropped. A worker of the previous
#   release still running during the deploy cannot record an atomic success any more: its
#   atomic runs fail (not retried) until it is restarted.

from django.db import migrations, models

FUNCTION = "kumiko_jobs_atomic_success"
OLD_SIGNATURE = "(uuid, integer, xid8, timestamptz, jsonb)"
SIGNATURE = "(uuid, integer, xid8, timestamptz, jsonb, text)"

BODY = """
CREATE OR REPLACE FUNCTION {schema}.kumiko_jobs_atomic_success(
    p_run uuid, p_attempt integer, p_xid xid8, p_finished timestamptz, p_result jsonb,
    p_key text
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_schema text;
    v_key text;
BEGIN
    -- The run's commit waits for the WAL flush, whatever the body set for its transaction.
    PERFORM set_config('synchronous_commit', 'on', true);
    IF pg_current_xact_id_if_assigned() IS DISTINCT FROM p_xid THEN
        RAISE EXCEPTION 'kumiko_jobs: atomic run % is no longer in the transaction the runner '
            'opened for it: the job ended it itself (COMMIT or ROLLBACK through the driver)',
            p_run USING ERRCODE = 'KJ001';
    END IF;
    SELECT schema_name, atomic_key INTO v_schema, v_key FROM {schema}.kumiko_jobs_jobrun
        WHERE run_id = p_run FOR UPDATE;
    -- Under DB_ROLES the login is the tenant's role: only its own schema's runs.
    IF v_schema IS NULL OR v_schema = ''
            OR NOT has_schema_privilege(session_user, v_schema, 'USAGE') THEN
        RAISE EXCEPTION 'kumiko_jobs: run % is not a run of a schema this login may use', p_run
            USING ERRCODE = 'KJ002';
    END IF;
    -- Only the runner of this attempt holds the secret whose hash it wrote before the body's
    -- transaction opened; a job calling this function for a run (its own or another's) has not.
    IF p_key IS NULL OR v_key IS NULL OR v_key = ''
            OR v_key <> encode(sha256(convert_to(p_key, 'UTF8')), 'hex') THEN
        RAISE EXCEPTION 'kumiko_jobs: run % is not the atomic attempt this transaction was '
            'opened for', p_run USING ERRCODE = 'KJ004';
    END IF;
    UPDATE {schema}.kumiko_jobs_jobrun
        SET status = 'succeeded', finished_at = p_finished, error_type = '',
            error_message = '', result = p_result, atomic_key = ''
        WHERE run_id = p_run AND status = 'running' AND attempts = p_attempt;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'kumiko_jobs: run % no longer runs attempt %', p_run, p_attempt
            USING ERRCODE = 'KJ003';
    END IF;
END
$fn$;
REVOKE ALL ON FUNCTION {schema}.kumiko_jobs_atomic_success{signature} FROM PUBLIC;
"""

# Whoever may execute the old function (not its owner: owners keep their rights).
GRANTEES = """
SELECT quote_ident(r.rolname)
FROM pg_proc p, aclexplode(p.proacl) a JOIN pg_roles r ON r.oid = a.grantee
WHERE p.oid = to_regprocedure(%s) AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
"""


def _schema(schema_editor):  # type: ignore[no-untyped-def]
    from kumiko_jobs import conf

    return schema_editor.quote_name(conf.public_schema_name())


def _replace(schema_editor, old, new, body):  # type: ignore[no-untyped-def]
    """Create the function of signature ``new`` (``body``), grant it to whoever may execute the
    one of signature ``old``, then drop that one."""
    schema = _schema(schema_editor)
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(GRANTEES, [f"{schema}.{FUNCTION}{old}"])
        grantees = [row[0] for row in cursor.fetchall()]
        # Without parameters: the function's RAISE formats use '%'.
        cursor.execute(body(schema))
        for grantee in grantees:
            cursor.execute(f"GRANT EXECUTE ON FUNCTION {schema}.{FUNCTION}{new} TO {grantee}")
        cursor.execute(f"DROP FUNCTION IF EXISTS {schema}.{FUNCTION}{old}")


def _new(schema):  # type: ignore[no-untyped-def]
    return BODY.format(schema=schema, signature=SIGNATURE)


def _old(schema):  # type: ignore[no-untyped-def]
    # 0011's function, as it was (a landed migration never changes: read from it).
    from importlib import import_module

    previous = import_module("kumiko_jobs.migrations.0011_atomic_success")
    return previous.BODY.format(schema=schema, signature=OLD_SIGNATURE)


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    _replace(schema_editor, OLD_SIGNATURE, SIGNATURE, _new)


def backwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    _replace(schema_editor, SIGNATURE, OLD_SIGNATURE, _old)


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0016_view_all_tenants"),
    ]

    operations = [
        migrations.CreateModel(
            name="AdmissionLock",
            fields=[("key", models.TextField(primary_key=True, serialize=False))],
        ),
        migrations.AddField(
            model_name="jobrun",
            name="atomic_key",
            field=models.CharField(
                blank=True, db_default="", default="", editable=False, max_length=64
            ),
        ),
        migrations.RunPython(forwards, backwards),
    ]
