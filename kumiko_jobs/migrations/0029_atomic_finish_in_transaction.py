# An atomic run's finish rides in its transaction (issue 25: d/a).
#
# kumiko_jobs_atomic_success gains a seventh argument, p_finish (jsonb, DEFAULT NULL): the
# attempt's row and the run's last columns, written by the function in the body's transaction,
# with its success. An atomic run that succeeds then costs no finish statement on the project's
# connection, and one synchronous commit instead of two (run/steps/atomic.py). Without it (NULL:
# the rarer finishes, with follow-ups, escape-hatch uses or a workflow, or a worker of the
# previous release calling with six arguments during a deploy, which resolves to this function
# through the default) the function does what 0017's did, and the finish follows as before.
#
# The checks are 0017's, unchanged and first: only the runner of this attempt holds the key, so a
# job calling the function cannot plant an attempt row either. The tenant's failure cleared by a
# success is looked up by the run row's own schema and job, never by what the caller says.
# Whoever could execute 0017's function may execute this one; 0017's is dropped.

from django.db import migrations

FUNCTION = "kumiko_jobs_atomic_success"
OLD_SIGNATURE = "(uuid, integer, xid8, timestamptz, jsonb, text)"
SIGNATURE = "(uuid, integer, xid8, timestamptz, jsonb, text, jsonb)"

BODY = """
CREATE OR REPLACE FUNCTION {schema}.kumiko_jobs_atomic_success(
    p_run uuid, p_attempt integer, p_xid xid8, p_finished timestamptz, p_result jsonb,
    p_key text, p_finish jsonb DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_schema text;
    v_key text;
    v_job text;
    v_progress boolean := p_finish IS NOT NULL AND p_finish ? 'progress';
BEGIN
    -- The run's commit waits for the WAL flush, whatever the body set for its transaction.
    PERFORM set_config('synchronous_commit', 'on', true);
    IF pg_current_xact_id_if_assigned() IS DISTINCT FROM p_xid THEN
        RAISE EXCEPTION 'kumiko_jobs: atomic run % is no longer in the transaction the runner '
            'opened for it: the job ended it itself (COMMIT or ROLLBACK through the driver)',
            p_run USING ERRCODE = 'KJ001';
    END IF;
    SELECT schema_name, atomic_key, job_name INTO v_schema, v_key, v_job
        FROM {schema}.kumiko_jobs_jobrun WHERE run_id = p_run FOR UPDATE;
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
            error_message = '', result = p_result, atomic_key = '',
            duration_ms = CASE WHEN p_finish IS NULL THEN duration_ms
                ELSE (p_finish->>'duration_ms')::double precision END,
            waiting_for = CASE WHEN p_finish IS NULL THEN waiting_for ELSE '' END,
            progress = CASE WHEN v_progress THEN (p_finish->>'progress')::double precision
                ELSE progress END,
            progress_message = CASE WHEN v_progress THEN p_finish->>'progress_message'
                ELSE progress_message END
        WHERE run_id = p_run AND status = 'running' AND attempts = p_attempt;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'kumiko_jobs: run % no longer runs attempt %', p_run, p_attempt
            USING ERRCODE = 'KJ003';
    END IF;
    IF p_finish IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO {schema}.kumiko_jobs_jobattempt (run_id, number, started_at, finished_at,
            duration_ms, outcome, error_type, error_message, traceback, log, worker)
        VALUES (p_run, p_attempt, (p_finish->>'started_at')::timestamptz, p_finished,
            (p_finish->>'duration_ms')::double precision, 'succeeded', '', '', '',
            COALESCE(p_finish->'log', '[]'::jsonb), COALESCE(p_finish->>'worker', ''));
    -- A tenant's success clears its subject's tenant-visible failure (as the finish does).
    IF p_finish ? 'clear_subject' THEN
        DELETE FROM {schema}.kumiko_jobs_jobfailure
            WHERE schema_name = v_schema AND job_name = v_job
                AND subject = p_finish->>'clear_subject';
    END IF;
END
$fn$;
REVOKE ALL ON FUNCTION {schema}.kumiko_jobs_atomic_success{signature} FROM PUBLIC;
"""


def _previous():  # type: ignore[no-untyped-def]
    # 0017's function and its replacement helper, as they were (a landed migration never changes).
    from importlib import import_module

    return import_module("kumiko_jobs.migrations.0017_outlive_run")


def _new(schema):  # type: ignore[no-untyped-def]
    return BODY.format(schema=schema, signature=SIGNATURE)


def _old(schema):  # type: ignore[no-untyped-def]
    return _previous().BODY.format(schema=schema, signature=OLD_SIGNATURE)


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    _previous()._replace(schema_editor, OLD_SIGNATURE, SIGNATURE, _new)


def backwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    _previous()._replace(schema_editor, SIGNATURE, OLD_SIGNATURE, _old)


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0028_operate_tenant_runs"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
