"""``kumiko_jobs.runner.execute``: the function every queued message and cron entry names.

RQ stores this dotted path in Redis (``transport.RUNNER``), so it outlives any layout of the
package: messages queued by an older release still run. The run side lives in ``run/``.
"""

from .run.entry import execute

__all__ = ["execute"]
