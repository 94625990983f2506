"""The one function RQ calls for every kumiko message.

decode -> definition -> pipeline -> dispatch. A message that fails to decode is recorded as a
``RejectedMessage`` and never reaches a schema; a message for a job this worker does not know
fails its run closed. Neither is retried.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any

from django.db import connections

from .. import transport
from ..core import conf, current, idle_connections
from ..core import envelope as envelope_mod
from ..core.current import job_alarm
from ..core.exceptions import EnvelopeError, JobNotRegistered
from ..core.outcome import DeferralKind, Outcome
from ..definition.options import is_async
from ..definition.registry import registry
from ..enqueueing.messages import message_for
from ..history import results, transitions
from ..history.rejections import record_rejection
from . import async_body
from .context import JobContext
from .pipeline import Next, compose
from .state import Alarm, Deferral, Delivery, RunState, running
from .steps import DEFAULT_STEPS

logger = logging.getLogger("kumiko_jobs.runner")

_pipeline: Next | None = None
_worker_name = f"{socket.gethostname()}:{__import__('os').getpid()}"


def build_pipeline() -> Next:
    """The runner's chain: ``DEFAULT_STEPS`` in front of the job's own function."""
    return compose(DEFAULT_STEPS, call_job)


def call_job(state: RunState) -> None:
    """The terminal step: the job's own function."""
    ctx = JobContext(state, conf.get().LOG_LINES_PER_ATTEMPT)
    func = state.definition.func
    with _final_timeout(state.alarm):
        if is_async(func):
            # In this thread's tenant, guard and connection; cancelled by the timeout.
            result = async_body.call_async(state, func, ctx, **state.envelope.kwargs)
        else:
            result = func(ctx, **state.envelope.kwargs)
    if isinstance(result, Deferral):
        state.ending.defer(result.seconds, DeferralKind.JOB)
    else:
        # Encoded here, still in the tenant and under the guard (results.py says why).
        state.ending.succeed(results.keep(state.envelope.run_id, state.envelope.job, result))


@contextlib.contextmanager
def _final_timeout(alarm: Alarm) -> Iterator[None]:
    """A timeout is final: once it fired, the body cannot turn the attempt into anything else.

    A job that catches ``Exception`` swallows RQ's timeout; the worker's death penalty noted it
    on the run's alarm (``alarm.fired``). From then on every SQL statement of the body raises
    the timeout again (a swallowing job cannot go on writing its tenant's data), and however
    the body ends, returning or raising something else, it ends in the timeout, which the
    retry step then treats like any other (retried per ``retries``, never ``succeeded``).
    """

    def refuse_after_timeout(execute: Any, sql: Any, params: Any, many: Any, context: Any) -> Any:
        if alarm.fired is not None:
            raise _timed_out(alarm, "a SQL statement after it")
        return execute(sql, params, many, context)

    with contextlib.ExitStack() as stack:
        for conn in connections.all():
            stack.enter_context(conn.execute_wrapper(refuse_after_timeout))
        try:
            try:
                yield
            finally:
                # The timeout bounds the job's code; the outcome's record after it must not be
                # cut short by it (the worker's watchdog still bounds that).
                cancel_alarm = job_alarm.get()
                if cancel_alarm is not None:
                    cancel_alarm()
        except BaseException as exc:
            if alarm.fired is None or isinstance(exc, transport.JobTimeout):
                raise
            raise _timed_out(alarm, f"it raised {type(exc).__name__} instead") from exc
    if alarm.fired is not None:
        raise _timed_out(alarm, "it returned")


def _timed_out(alarm: Alarm, after: str) -> Exception:
    return transport.JobTimeout(
        f"the attempt exceeded its timeout of {alarm.fired} s; the job caught the "
        f"timeout and went on ({after}), so the attempt is recorded as timed out"
    )


def execute(message: object) -> str:
    """Run one message. Returns the outcome; raises only when the history cannot be written."""
    rq_job_id = transport.current_job_id()
    try:
        env = envelope_mod.decode(message)
    except EnvelopeError as exc:
        record_rejection(message, str(exc), rq_job_id, transport.current_job_origin())
        return "rejected"
    try:
        definition = registry.get(env.job)
    except JobNotRegistered as exc:
        _fail_unknown(env, str(exc))
        return "failed"
    if env.is_template:
        # A cron alarm is not a run: only the scheduler turns it into a tick (schedules.fire),
        # identified by signed data. A template in a queue is a copy (or a version 1 template
        # queued before a deploy): running it would start a tick no schedule fired.
        record_rejection(
            message,
            f"cron template of {env.job} is not a run: kumiko's scheduler fires ticks",
            rq_job_id,
            transport.current_job_origin(),
        )
        return "rejected"
    delivery = Delivery(
        envelope=env,
        definition=definition,
        rq_job_id=rq_job_id,
        queue=transport.current_job_origin() or definition.queue_name,
        worker_name=_worker_name,
    )
    state = RunState(delivery)
    run_state(state)
    ending = state.ending
    if ending.outcome is not None and ending.outcome.final and not ending.superseded:
        # handle.wait()'s signal, sent by the worker's finish pipeline (no round trip more).
        link = state.workflow
        ended = [link.workflow_id.hex] if link.ended and link.workflow_id else []
        transport.note_done(env.run_id, *ended)
    # A plain string for RQ's result, as before the enum ("" if no step decided).
    return str(state.ending.outcome or "")


def run_state(state: RunState, *, push: bool = True) -> None:
    """Run the pipeline, then push what the attempt asked for (``push=False``: the caller
    handles ``state.ending.reschedule`` itself and nothing is sent; boot gates run inline)."""
    global _pipeline
    if _pipeline is None:
        _pipeline = build_pipeline()
    # Nothing outlives a run (docs/guard.md): the attempt runs in a fresh copy of the context,
    # so a ContextVar, translation or time zone it sets ends with it, and kumiko's own
    # variables start unset; Django's locale is put back to the defaults around it as well.
    current.reset_locale()
    try:
        current.attempt_context().run(_run_pipeline, _pipeline, state)
    finally:
        current.reset_locale()
    if push:
        dispatch(state)


def _run_pipeline(pipeline: Next, state: RunState) -> None:
    # Before the history's first statement: a kept connection that PostgreSQL ended while the
    # worker was idle is replaced, not failed on (core.idle_connections).
    idle_connections.close_dead()
    with running(state):
        pipeline(state)


def dispatch(state: RunState) -> None:
    """Push what the attempt asked for, now that its history is written (nothing when the
    history refused it: ``Ending.superseded``)."""
    if state.ending.superseded:
        return
    messages = []
    if state.ending.reschedule is not None:
        next_env, delay = state.ending.reschedule
        messages.append(message_for(state.definition, next_env, delay))
    if state.ending.outcome is Outcome.SUCCEEDED:
        messages.extend(state.followups.messages())
    messages.extend(state.workflow.released)  # workflow steps its finish released
    if messages:
        transport.push_many(messages)


def _fail_unknown(env: envelope_mod.Envelope, reason: str) -> None:
    logger.error("run %s failed closed: %s", env.run_id, reason)

    updated = transitions.fail_closed(env.run_id, "JobNotRegistered", reason, attempts=env.attempt)
    if not updated:
        record_rejection(env, reason, transport.current_job_id(), transport.current_job_origin())


def reset_pipeline(factory: Callable[[], Next] | None = None) -> None:
    """Rebuild the pipeline (tests that change steps)."""
    global _pipeline
    _pipeline = factory() if factory else None
