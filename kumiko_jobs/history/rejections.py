"""Queue messages refused without a run: one ``RejectedMessage`` row each.

The runner (a message that does not decode, a cron template in a queue, an unknown job without
a run row), the records step (a message whose run row is gone) and the worker (a message that
is not a call of the runner, a job hash RQ cannot load) all refuse this way. The row is written
here, below all three, so none of them imports another to record a refusal. The caller passes
the queue: only the run and worker sides know which queue the message came from.
"""

from __future__ import annotations

import logging

from ..core.text import storable
from ..models import RejectedMessage

# The runner's logger, as before this module existed: users' LOGGING may route it.
logger = logging.getLogger("kumiko_jobs.runner")


def record_rejection(message: object, reason: str, rq_job_id: str, queue: str) -> None:
    """Log the refusal and store it with an excerpt of the message (forged text made storable)."""
    logger.error("rejected queue message %s: %s", rq_job_id or "?", reason)
    try:
        excerpt = message if isinstance(message, str) else repr(message)
    except RecursionError:
        excerpt = f"<a {type(message).__name__} nested too deeply to show>"
    RejectedMessage.objects.create(
        rq_job_id=_storable(rq_job_id, 128),
        reason=_storable(reason, 500),
        queue=_storable(queue, 100),
        excerpt=_storable(excerpt, 2000),
    )


def _storable(text: str, limit: int) -> str:
    """Forged text as PostgreSQL can store it: NUL and lone surrogates escaped, not fatal."""
    return storable(text[:limit])[:limit]
