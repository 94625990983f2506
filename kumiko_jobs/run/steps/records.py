"""Run history: ``running`` at start, the outcome at the end, in the public schema.

Both writes run outside the tenant and outside the guard. The start is one statement (the run
marked ``running``, its tenant loaded for the gates); the end is one statement in the common
case, else one short transaction (attempt row, run row, tenant-visible failure, follow-up rows).
Every write goes through ``history.transitions`` (its hot-path SQL lives in ``run_sql``).

A run starts only for the one message it waits for. Any other (a repeated push, a stale attempt,
a message for a cancelled or finished run) is dropped here, which makes redelivery harmless. A
message without a run row is refused and recorded: a run is never recreated from a message.
"""

from __future__ import annotations

import logging
import os
import random
import time
from typing import Any

from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections
from django.utils import timezone

from ... import signals
from ...core import conf, session
from ...core.exceptions import Unrecoverable
from ...core.outcome import Outcome
from ...enqueueing import workflow_release
from ...enqueueing.fanout import insert_new
from ...history import atomic_sql, audit, rejections, transitions
from ...models import RunStatus
from .. import report
from ..pipeline import Next
from ..state import Found, Missing, RunState, Timing
from . import finish_retries

logger = logging.getLogger("kumiko_jobs.records")

_SIGNAL_FOR = {
    Outcome.SUCCEEDED: signals.job_succeeded,
    Outcome.FAILED: signals.job_failed,
    Outcome.RETRYING: signals.job_failed,
    Outcome.DEFERRED: signals.job_deferred,
    Outcome.DROPPED: signals.job_dropped,
    Outcome.CANCELLED: signals.job_dropped,
}


def records(state: RunState, call_next: Next) -> None:
    """Mark the run ``running`` (dropping a message it does not wait for), run the rest of the
    pipeline, and write its outcome whatever happens, so no run is left ``running`` by an
    interruption.
    """
    if not _start(state):
        return
    try:
        call_next(state)
    except BaseException as exc:
        # Interrupted (cold shutdown, timeout outside the job body): never leave it running.
        state.ending.fail(state.ending.error or exc)
        _finish(state)
        session.settle_resets()
        raise
    if state.ending.outcome is Outcome.SUCCEEDED and not state.definition.atomic:
        crash_point(state)  # test hook: the body's effect committed, its success not yet
    _finish(state)
    # The tenant login's session reset (tenancy step) was sent without waiting; its reply came
    # while the finish was written, and is read now, before the worker moves on (core.session).
    session.settle_resets()


def crash_point(state: RunState) -> None:
    """Test hook (``conf.crash_hook``): exit the process here, between a successful body and
    the commit of its success, where a crash makes a non-atomic run's effect happen twice."""
    hook = conf.crash_hook()
    if hook is None or random.random() >= hook.probability:
        return
    if hook.log_path:
        with open(hook.log_path, "a") as log:
            kind = "atomic" if state.definition.atomic else "plain"
            log.write(f"{state.envelope.run_id} {kind}\n")
            log.flush()
            os.fsync(log.fileno())
    os._exit(70)


def _start(state: RunState) -> bool:
    env = state.envelope
    now = timezone.now()
    state.timing = Timing(started_at=now)
    # An atomic run's key rides on the start: no statement of its own (the atomic step).
    key = atomic_sql.atomic_digest(state.delivery.atomic_secret) if state.definition.atomic else ""
    started = transitions.start(
        run_id=env.run_id,
        attempt=env.attempt,
        started_at=now,
        defers=env.defers,
        gate_defers=env.gate_defers,
        rq_job_id=state.delivery.rq_job_id,
        schema=env.schema,
        atomic_key=key,
    )
    # The gates step decides what a missing or inactive tenant means; it was loaded here
    # because it costs nothing more in the same round trip.
    state.tenancy.lookup = Missing() if started.tenant is None else Found(started.tenant)
    state.workflow.workflow_id = started.workflow_id  # None outside a workflow: no statement
    updated = started.updated
    if not updated:
        row = transitions.run_row(env.run_id)
        if row is None:
            _refuse_without_row(state)
            return False
        status, attempts = row
        if status == RunStatus.RUNNING and attempts < env.attempt:
            # The previous attempt's worker died after scheduling this one: take over.
            transitions.take_over(env.run_id, env.attempt, now, key)
        else:
            why = _why_not_waiting(state, status, attempts)
            logger.info("dropping %s for run %s: %s", env.job, env.run_id, why)
            _drop(state, why)
            return False
    signals.send(
        signals.job_started,
        run_id=env.run_id,
        job_name=env.job,
        schema_name=env.schema,
        attempt=env.attempt,
    )
    return True


def _why_not_waiting(state: RunState, status: str, attempts: int) -> str:
    env = state.envelope
    if status == RunStatus.CANCELLED:
        return "cancelled before it started"
    if status in (RunStatus.QUEUED, RunStatus.DEFERRED):
        return (
            f"stale message (attempt {env.attempt}, deferrals {env.defers}/{env.gate_defers}): "
            f"the run is {status} after attempt {attempts} and waits for another"
        )
    return f"duplicate delivery: the run is already {status}"


def _refuse_without_row(state: RunState) -> None:
    """A message whose run has no history row: refused and recorded, never run.

    Every path that pushes a message commits the run's row first (enqueue on commit, follow-ups
    and fan-out children in the finishing transaction, retries by the sweep, cron ticks by the
    scheduler, relayed messages from the row itself), so a missing row means it is gone:
    deleted by retention or by hand. Recreating the run from the message would run a finished
    job again from any copy of its message.
    """
    env = state.envelope
    reason = (
        f"no run {env.run_id} of {env.job}: its history row is gone (deleted by retention or by "
        "hand); a run is never recreated from a message"
    )
    logger.warning("refused message for run %s: %s", env.run_id, reason)
    excerpt = f"run_id={env.run_id} job={env.job} schema={env.schema} attempt={env.attempt}"
    rejections.record_rejection(
        excerpt, reason, state.delivery.rq_job_id, state.delivery.queue, schema=env.schema or ""
    )
    _drop(state, reason)


def _drop(state: RunState, reason: str) -> None:
    """The message is not run: the attempt ends dropped, and ``job_dropped`` says why."""
    env = state.envelope
    state.ending.drop(reason)
    signals.send(
        signals.job_dropped,
        run_id=env.run_id,
        job_name=env.job,
        schema_name=env.schema,
        attempt=env.attempt,
        outcome=Outcome.DROPPED,
        error=None,
        reason=reason,
    )


def _finish(state: RunState) -> None:
    """Write the attempt's outcome (then send its signal and report it)."""
    env = state.envelope
    _end_stray_transaction(state)
    _settle_in_doubt(state)
    if state.atomicity.committed and state.atomicity.riding_end is not None:
        # Written by the atomic step's success function, in the body's transaction (0029).
        _finished(state, state.atomicity.riding_end)
        return
    end = attempt_end(state)
    outcome = end.outcome
    # The row the finish may write over: the attempt still running, or, for an atomic attempt
    # whose success function committed without the finish riding on it (escape-hatch uses or a
    # workflow to write; an in-doubt COMMIT that did commit), its success.
    expected = RunStatus.SUCCEEDED if state.atomicity.committed else RunStatus.RUNNING
    records_failure = (
        bool(env.schema) and outcome is Outcome.FAILED and bool(state.ending.failure_key)
    )
    followups = outcome is Outcome.SUCCEEDED and bool(state.followups.entries)
    # A workflow step's final outcome moves its workflow on in the same transaction.
    in_workflow = outcome.final and state.workflow.workflow_id is not None
    if not (records_failure or state.audit_uses.reported or followups or in_workflow):
        # The common case: one statement, so one round trip and its own transaction. A
        # tenant's success clears its subject's failure in it, however that failure was
        # recorded (a TenantVisibleError needs no tenant_visible_failure declared).
        clears = env.schema and outcome is Outcome.SUCCEEDED
        subject = (env.schema or "", env.job, state.tenancy.subject) if clears else None
        written = finish_retries.write_finish(
            state,
            lambda: transitions.finish_attempt(end, clear_failure=subject, expected=expected),
            end.finished_at,
        )
    else:
        now = end.finished_at
        written = transitions.finish_attempt(
            end, also=lambda: _other_writes(state, now), expected=expected
        )
    if not written:
        _superseded(state, end)
        return
    _finished(state, end)


def _superseded(state: RunState, end: transitions.AttemptEnd) -> None:
    """The attempt ended after the run stopped being its: the sweep handed it back (this
    worker looked dead: its beats stopped, say a job held the GIL past ``WORKER_DEAD_AFTER``),
    an operator's cancellation ended it, or another delivery took it over. Its outcome is not
    written over what the row says now, nor are its follow-ups or its signal sent: the row,
    and the attempt that owns it, decide. What the body did outside the history stays done.
    Nothing of it is pushed either (``Ending.supersede``): no retry, no follow-up (their rows
    were not written), no released workflow step, no done signal."""
    state.followups.close()
    state.ending.supersede()
    logger.warning(
        "run %s: attempt %d ended %s after the run stopped being this attempt's (handed back "
        "by the sweep, cancelled or taken over); its outcome was not recorded",
        state.envelope.run_id,
        state.envelope.attempt,
        end.outcome,
    )


def _finished(state: RunState, end: transitions.AttemptEnd) -> None:
    """The attempt's outcome is written: send its signal and report it."""
    # Written: an enqueue from here on (a signal receiver's) is an ordinary enqueue.
    state.followups.close()
    _send_outcome(state, end)
    report.run_finished(state, end.duration_ms)


def _end_stray_transaction(state: RunState) -> None:
    """A transaction the run left open is rolled back, and a success or deferral fails."""
    if not transitions.end_stray_transaction():
        return
    logger.error(
        "run %s left a transaction open; rolled back before its outcome", state.envelope.run_id
    )
    if state.ending.outcome in (Outcome.SUCCEEDED, Outcome.DEFERRED):
        state.ending.fail(
            state.ending.error
            or Unrecoverable(
                "the run left a transaction open; it was rolled back, nothing in it committed"
            )
        )


def attempt_end(state: RunState) -> transitions.AttemptEnd:
    """The attempt's end as the history records it (``transitions`` makes the columns)."""
    now = timezone.now()
    ending = state.ending
    outcome = ending.outcome or Outcome.FAILED
    # The job's exception as it was rendered inside its tenant and guard (never str() here).
    described = ending.described_error()
    return transitions.AttemptEnd(
        run_id=state.envelope.run_id,
        number=state.envelope.attempt,
        outcome=outcome,
        started_at=state.timing.started_at or now,
        finished_at=now,
        duration_ms=(time.monotonic() - state.timing.started_monotonic) * 1000,
        error_type=described.type_name if described is not None else None,
        error_message=described.message if described is not None else "",
        traceback=ending.error_traceback,
        log=state.log.lines,
        worker=state.delivery.worker_name,
        waiting_for=ending.deferral_kind,
        retry_in=ending.reschedule[1] if ending.reschedule is not None else None,
        # Already plain JSON (or a marker), made in run.entry.call_job.
        result=ending.result,
        drop_reason=ending.drop_reason,
        # The job's last ctx.progress() the row lacks, in the same statement (none: no column).
        progress=state.progress.finish_columns(),
    )


def _send_outcome(state: RunState, end: transitions.AttemptEnd) -> None:
    env, outcome = state.envelope, end.outcome
    extra = {}
    if _SIGNAL_FOR[outcome] is signals.job_dropped:
        # job_dropped's receivers get a reason (signals.py).
        described = end.error_message if end.error_type is not None else outcome
        extra["reason"] = state.ending.drop_reason or described
    signals.send(
        _SIGNAL_FOR[outcome],
        run_id=env.run_id,
        job_name=env.job,
        schema_name=env.schema,
        attempt=env.attempt,
        outcome=outcome,
        error=state.ending.error,
        **extra,
    )


def _settle_in_doubt(state: RunState) -> None:
    """An atomic attempt whose COMMIT's reply was lost: the run's row says whether it committed.

    The deferral step took the lost connection for a failure (a retry, or the last attempt's
    failure). Written so, a retry would run the body again over a row the success function had
    marked ``succeeded``: the effect twice. So before anything but the success is recorded, the
    row is asked on a new connection (``transitions.committed_success``, which waits for the
    COMMIT if the server is still on it): ``succeeded`` with this attempt means the body's
    writes and the success committed, and the attempt is recorded as the success it was, with
    no retry; anything else means nothing committed, and the failure stands. No statement more
    on any other path. A connection lost again is tried ``FINISH_TRIES`` times in all, then the
    run is left to the sweep, which claims only a run still ``running``.
    """
    if not state.atomicity.in_doubt or state.ending.outcome is Outcome.SUCCEEDED:
        return
    env = state.envelope
    for tries_left in range(finish_retries.FINISH_TRIES - 1, -1, -1):
        try:
            committed = transitions.committed_success(env.run_id, env.attempt)
            break
        except (OperationalError, InterfaceError):
            if tries_left == 0:
                raise
            connections[DEFAULT_DB_ALIAS].close()
            time.sleep(finish_retries.FINISH_PAUSE)
    state.atomicity.note_committed(committed)
    if committed:
        logger.warning("run %s: its COMMIT's reply was lost, and it had committed", env.run_id)
        state.ending.succeed(state.ending.result)
    else:
        logger.info("run %s: its COMMIT's reply was lost, and it had not committed", env.run_id)


def _other_writes(state: RunState, now: Any) -> None:
    """What the finish writes besides the run's two rows, in their transaction."""
    env, outcome = state.envelope, state.ending.outcome or Outcome.FAILED
    if env.schema and outcome is Outcome.FAILED and state.ending.failure_key:
        transitions.record_failure(
            env.schema, env.job, state.tenancy.subject, state.ending.failure_key, now, env.run_id
        )
    elif env.schema and outcome is Outcome.SUCCEEDED:
        transitions.clear_failure(env.schema, env.job, state.tenancy.subject)
    audit.save_uses(state)
    if outcome is Outcome.SUCCEEDED and state.followups.entries:
        # A follow-up of a unique job whose key an active run already holds is not written
        # (kj_run_unique_active), and its message is then not pushed either.
        state.followups.keep(insert_new(state.followups.rows()))
    if outcome.final:
        workflow_release.advance(state.workflow, env.run_id, outcome.status)
