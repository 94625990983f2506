"""``kumiko_jobs.context.JobContext``: the ``ctx`` a job body receives, at its documented path.

Job modules type their bodies with it (``def sync(ctx: JobContext, ...)``); the class lives in
``run/context.py`` with the rest of the run side.
"""

from .run.context import JobContext

__all__ = ["JobContext"]
