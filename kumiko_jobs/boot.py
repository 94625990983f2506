"""Jobs that belong to worker start-up.

* ``boot_gate=True``: runs inline, through the full pipeline, before the worker takes its first
  message. If it fails, the worker does not start (``BootGateFailed``): a worker that cannot
  reach a dependency it needs should not drain the queue into failures.
* ``run_on_boot=True``: enqueued once per Redis dataset (a flag in Redis, set with NX), so ten
  workers starting together enqueue it once, and a flushed or new Redis enqueues it again.
"""

from __future__ import annotations

import logging

from . import transport
from .context import RunState
from .envelope import Envelope, new_run_id
from .exceptions import KumikoJobsError
from .registry import registry

logger = logging.getLogger("kumiko_jobs.boot")


class BootGateFailed(KumikoJobsError):
    """A boot gate failed; the worker refuses to start."""


def on_worker_start() -> None:
    run_boot_gates()
    enqueue_boot_jobs()


def run_boot_gates() -> None:
    from .runner import run_state

    for definition in registry:
        if not definition.boot_gate:
            continue
        env = Envelope(
            job=definition.name, schema=None, kwargs={}, run_id=new_run_id(), trigger="boot"
        )
        state = RunState(envelope=env, definition=definition, queue="boot", rq_job_id="boot")
        _insert_row(state)
        run_state(state)
        if state.outcome != "succeeded":
            described = state.described_error()
            error = f"{described.type_name}({described.message!r})" if described else None
            raise BootGateFailed(
                f"boot gate {definition.name!r} {state.outcome}: {error}; the worker does not start"
            )


def _insert_row(state: RunState) -> None:
    from .enqueueing import _row

    _row(state.definition, state.envelope, "", 0.0).save(force_insert=True)


def enqueue_boot_jobs() -> list[str]:
    from .enqueueing import submit

    started = []
    for definition in registry:
        if not definition.run_on_boot:
            continue
        if not transport.set_flag_once(f"kumiko_jobs:booted:{definition.name}"):
            continue
        handle = submit(definition, None, {}, delay=0.0, trigger="boot")
        logger.info("enqueued boot job %s (run %s)", definition.name, handle.run_id)
        started.append(handle.run_id)
    return started
