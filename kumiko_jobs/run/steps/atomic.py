"""``@job(atomic=True)``: the body's writes and the run's success commit in one transaction.

Between the tenancy step (the body's connection: under DB_ROLES the tenant's login) and the
guard. The records step has already written, with the run's start, the hash of a secret only
this delivery holds (``Delivery.atomic_secret``, ``atomic_sql.atomic_digest``). The transaction is
opened on the default alias of the body's connection; the runner reads its id before the body
runs, and after a successful body records the success through migration 0029's SECURITY
DEFINER function in the same transaction (in the common case with the attempt's row and the
run's last columns: the run's finish, so no finish statement and no second synchronous commit
follow), which refuses without the attempt's secret (a job calling it for its own run or
another running run of its tenant: issue 22) and if the body ended the transaction itself (a
raw COMMIT or ROLLBACK the guard did not see). Then it commits, in the same round trip as the
success (``SELECT ...; COMMIT``; the ``BEGIN`` likewise rides on the query that reads the
transaction's id, ``atomic_sql.atomic_begin``):
a crash before the COMMIT leaves neither the effect nor the success, one after it leaves both,
and the redelivered message finds the run ``succeeded`` and is dropped (records step). A
COMMIT whose reply is lost (a cut, a terminated session) is in doubt: the state says so, and the
records step asks the run's row before it records anything but the success.

Anything but a success rolls the body back: an exception, a deferral, a swallowed guard
denial. The records step then writes that outcome as for any job, on the project's connection.
docs/reliability.md, "Exactly once for database-only jobs", says what such a job may not do.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, OperationalError, connections
from django.utils import timezone

from ...core.exceptions import Unrecoverable
from ...core.outcome import Outcome
from ...guard.roles import search_path
from ...history import atomic_sql, transitions
from ..pipeline import Next
from ..state import RunState
from .records import attempt_end, crash_point


def atomic(state: RunState, call_next: Next) -> None:
    """For an ``atomic=True`` tenant job, run the rest of the pipeline in one transaction and record
    the success inside it, so the body's writes and the success commit together; anything but a
    success rolls the body back.
    """
    if not state.definition.atomic or state.tenant is None:
        call_next(state)
        return
    # The secret whose hash the start wrote (records step): without that start (a pipeline
    # without the records step) the success function refuses, and the body is rolled back.
    key = state.delivery.atomic_secret
    # The body's search path, set (if it must be) before the transaction: kept for later runs.
    search_path.settle(connections[DEFAULT_DB_ALIAS])
    # Inside a caller's transaction (an inline run) the block is a savepoint: nothing commits.
    outermost = not connections[DEFAULT_DB_ALIAS].in_atomic_block
    committing = False
    try:
        with atomic_sql.atomic_transaction() as xid:
            call_next(state)
            if state.ending.outcome is not Outcome.SUCCEEDED or state.watch.violations:
                atomic_sql.atomic_roll_back()
                return
            crash_point(state)  # test hook: after the body, before its success and COMMIT
            # The outermost transaction's COMMIT rides on the success (one round trip): from
            # here on, a lost reply may hide a COMMIT that happened.
            committing = outermost
            _record_success(state, xid, key, commit=outermost)
    except (OperationalError, InterfaceError):
        if committing:
            # The COMMIT was sent and its reply lost (a cut, a terminated session): PostgreSQL
            # may have committed the effect and the success. The records step asks the row
            # before it records anything else (records._settle_in_doubt).
            state.atomicity.note_in_doubt()
        raise
    state.atomicity.note_committed()


def _record_success(state: RunState, xid: str, key: str, *, commit: bool) -> None:
    """The run's success through migration 0029's function, in the body's transaction; with
    ``commit``, the COMMIT in the same round trip (``atomic_sql.atomic_success``). In the common
    case the attempt's finish rides along (``_riding_end``), and the records step writes none."""
    end = _riding_end(state)
    finish = None
    if end is not None:
        state.atomicity.riding_end = end
        clears = state.tenancy.subject if state.envelope.schema else None
        finish = atomic_sql.riding_finish(
            transitions.attempt_columns(end), transitions.run_columns(end), clears
        )
    try:
        transitions.atomic_success(
            run_id=state.envelope.run_id,
            attempt=state.envelope.attempt,
            xid=xid,
            key=key,
            finished_at=end.finished_at if end is not None else timezone.now(),
            result=state.ending.result,
            commit=commit,
            finish=finish,
        )
    except DatabaseError as exc:
        if end is not None and end.progress:
            state.progress.dirty = True  # not written: the records step's finish writes it
        if _connection_lost(exc):
            # The session died under it (pg_terminate_backend, a restart, a cut network):
            # without ``commit`` the transaction died with it, uncommitted, and the run is
            # retried like any run whose database went away; with it, the COMMIT may have
            # happened, and the records step asks the row (``atomic``: in doubt).
            raise
        if commit and not _refused(exc):
            # Not the function's refusal: the COMMIT's own error (a deferred constraint, a
            # serialization failure), or the function's on a live session. Nothing
            # committed; raised as a failed COMMIT always was.
            raise
        # Not retried: a job that ends its own transaction does so again, and what it
        # committed before is committed (its effect may exist without the success).
        raise Unrecoverable(
            f"the atomic run's success could not be recorded in its transaction: {exc}"
        ) from exc


def _riding_end(state: RunState) -> transitions.AttemptEnd | None:
    """The successful attempt's end, when its finish can be written by the success function: the
    records step's common case (one statement: the attempt's row, the run's columns, the tenant's
    failure cleared). A finish with more to write (escape-hatch uses, a workflow moved on) is
    written by the records step after the COMMIT, as before. (An atomic job has no follow-ups:
    ``ctx.enqueue`` refuses them.)"""
    if state.audit_uses.reported or state.workflow.workflow_id:
        return None
    return attempt_end(state)


def _refused(exc: DatabaseError) -> bool:
    """Whether ``exc`` is the success function's refusal (migration 0017: SQLSTATE KJ001-KJ004)."""
    return str(getattr(exc.__cause__, "sqlstate", None) or "").startswith("KJ")


def _connection_lost(exc: DatabaseError) -> bool:
    """Whether ``exc`` came with the loss of the body's connection (not a refusal of the
    success function, which raises on a live connection)."""
    if not isinstance(exc, (OperationalError, InterfaceError)):
        return False
    raw = connections[DEFAULT_DB_ALIAS].connection
    return raw is None or bool(raw.closed) or bool(getattr(raw, "broken", False))
