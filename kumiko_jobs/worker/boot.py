"""Jobs that belong to worker start-up.

* ``boot_gate=True``: runs inline, through the full pipeline, before the worker takes its first
  message, on the workers that serve the gate's queue (a gate guards the work of its queue; a
  worker of other queues does not depend on it). If it fails, the worker does not start
  (``BootGateFailed``): a worker that cannot reach a dependency it needs should not drain the
  queue into failures. Each attempt is bounded by ``BOOT_GATE_TIMEOUT`` (RQ's death penalty
  does not cover code that runs before the worker loop) and logs a warning once it has run
  ``BOOT_GATE_WARN_AFTER`` seconds. ``ctx.defer(delay)`` in a gate means "not ready yet": the
  worker waits ``delay`` and runs the gate again, within its ``max_defers``; a gate's retries
  run inline too. Nothing of a gate is ever pushed to a queue.
* ``run_on_boot=True``: enqueued once per Redis dataset. The dataset is identified by a token
  set once (``SET NX``) in Redis (``transport.boot_dataset_token``); the boot run's id is
  derived from (job, token). A ``BootMarker`` with that id is written in the transaction that
  writes the run's row, the outbox: ten workers starting together write it once (the marker's
  primary key makes the others wait, then skip), a worker that dies between the commit and
  the push leaves the push to the relay, and a flushed or new Redis (a new token) enqueues it
  again. The marker, not the run row, says "enqueued": retention deletes old runs and never
  markers, so a boot job does not run again once its run has expired.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from .. import transport
from ..core import conf
from ..core.envelope import Envelope
from ..core.exceptions import BootGateFailed
from ..core.outcome import Outcome
from ..definition.job import JobDefinition
from ..definition.registry import registry
from ..enqueueing.messages import row_for
from ..enqueueing.submit import submit
from ..models import BootMarker
from ..run.entry import run_state
from ..run.state import Delivery, RunState

logger = logging.getLogger("kumiko_jobs.boot")

_BOOT_NAMESPACE = uuid.UUID("3c8f8a52-6a55-4c35-9d2e-8c1b6b2f5a10")

# A context manager factory (seconds) -> bounds one gate attempt; the worker passes its death
# penalty, so a timeout is final exactly as for a queued run.
Bound = Callable[[int], Any]


def on_worker_start(queues: Collection[str] | None = None, bound: Bound | None = None) -> None:
    """What a worker does before its first message: run the boot gates of its queues (each to its
    end; a failure stops the worker), then enqueue the boot jobs not yet enqueued.
    """
    run_boot_gates(queues, bound)
    enqueue_boot_jobs()


def run_boot_gates(queues: Collection[str] | None = None, bound: Bound | None = None) -> None:
    """Run the boot gates of ``queues`` (every gate when None), each to its end."""
    for definition in registry:
        if not definition.boot_gate:
            continue
        if queues is not None and definition.queue_name not in queues:
            logger.debug(
                "boot gate %s guards queue %s, not served here",
                definition.name,
                definition.queue_name,
            )
            continue
        _run_gate(definition, bound)


def _run_gate(definition: JobDefinition, bound: Bound | None) -> None:
    settings = conf.get()
    env = Envelope.boot(definition.name)
    _insert_row(definition, env)
    while True:
        state = RunState(Delivery(env, definition, rq_job_id="boot", queue="boot"))
        warning = threading.Timer(settings.BOOT_GATE_WARN_AFTER, _warn_long, (definition, env))
        warning.daemon = True
        warning.start()
        try:
            if bound is None:
                run_state(state, push=False)
            else:
                with bound(settings.BOOT_GATE_TIMEOUT):
                    run_state(state, push=False)
        finally:
            warning.cancel()
        ending = state.ending
        if ending.outcome is Outcome.SUCCEEDED:
            return
        if ending.reschedule is None:
            described = ending.described_error()
            error = f"{described.type_name}({described.message!r})" if described else None
            raise BootGateFailed(
                f"boot gate {definition.name!r} {ending.outcome or ''}: {error}; "
                "the worker does not start"
            )
        # Not ready yet (a deferral) or failed with attempts left (a retry): wait here and run
        # it again; the worker takes no message meanwhile.
        env, delay = ending.reschedule
        logger.warning(
            "boot gate %s %s; running it again in %.1f s before the worker starts",
            definition.name,
            "is not ready yet" if ending.outcome is Outcome.DEFERRED else "failed, will retry",
            delay,
        )
        time.sleep(delay)


def _warn_long(definition: JobDefinition, env: Envelope) -> None:
    settings = conf.get()
    logger.warning(
        "boot gate %s (run %s) has been running for %d s; the worker waits for it "
        "(BOOT_GATE_TIMEOUT=%d s)",
        definition.name,
        env.run_id,
        settings.BOOT_GATE_WARN_AFTER,
        settings.BOOT_GATE_TIMEOUT,
    )


def _insert_row(definition: JobDefinition, env: Envelope) -> None:
    row_for(definition, env, "", 0.0).save(force_insert=True)


def boot_run_id(job_name: str, dataset: str) -> str:
    """The run id of a boot job for one Redis dataset, derived from both, so every worker starting
    on that dataset names the same run and it is enqueued once.
    """
    return uuid.uuid5(_BOOT_NAMESPACE, f"{job_name}@{dataset}").hex


def enqueue_boot_jobs() -> list[str]:
    """Enqueue every ``run_on_boot`` job not yet enqueued for this Redis dataset."""
    boot_jobs = [d for d in registry if d.run_on_boot]
    if not boot_jobs:
        return []
    dataset = transport.boot_dataset_token(uuid.uuid4().hex)
    started = []
    for definition in boot_jobs:
        run_id = boot_run_id(definition.name, dataset)
        with transaction.atomic():
            if not _mark(run_id, definition.name, dataset):
                continue  # another worker (or this one, before a crash) enqueued it
            try:
                with transaction.atomic():
                    handle = submit(definition, None, {}, delay=0.0, trigger="boot", run_id=run_id)
            except IntegrityError:
                # Its run row without a marker: enqueued by a release before the markers
                # (0018). The marker is written now, so retention cannot make it run again.
                continue
        logger.info("enqueued boot job %s (run %s)", definition.name, handle.run_id)
        started.append(handle.run_id)
    return started


def _mark(run_id: str, job_name: str, dataset: str) -> bool:
    """Write the boot job's marker in the caller's transaction; False when it has one.

    A concurrent worker's uncommitted marker makes this wait on the primary key: it then
    skips (that worker committed) or writes its own (that worker rolled back or died).
    """
    try:
        with transaction.atomic():
            BootMarker.objects.create(
                run_id=run_id, job_name=job_name, dataset=dataset, enqueued_at=timezone.now()
            )
    except IntegrityError:
        return False
    return True
