"""System checks of Redis and the scheduler: a queue behind Sentinel without a socket timeout,
a queue name the fair dequeue's keys cannot tell apart (E018), a scheduler class that would
unpickle kumiko's JSON messages (E007), and (``check --deploy``)
delayed work overdue because no ``rqscheduler`` moves it. Registered at import
(``kumiko_jobs.checks`` imports this module at start-up)."""

from __future__ import annotations

import re
from typing import Any

from django.core import checks

from ..core import conf, project_settings
from ..core.checks import names_subclass
from .scheduler import Scheduler
from .scheduler_liveness import overdue_problem


@checks.register(checks.Tags.compatibility, deploy=True)
def check_scheduler_running(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``manage.py check --deploy``: delayed work overdue because no rqscheduler moves it.

    A deploy check because it reads Redis, which a plain ``check`` (run by every command)
    should not need; it says nothing when Redis cannot be read.
    """

    if conf.get_or_none() is None:
        return []  # E001 says why
    problem = overdue_problem()
    if not problem:
        return []
    return [
        checks.Warning(
            problem,
            hint="Run `python manage.py rqscheduler` next to the workers (README, 'Use it in "
            "your project'); KUMIKO_JOBS['SCHEDULER_OVERDUE_AFTER'] sets how late is overdue.",
            id="kumiko_jobs.W003",
        )
    ]


@checks.register(checks.Tags.compatibility)
def check_redis_sentinel(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A queue behind Sentinel without a socket timeout hangs on a frozen primary.

    A primary that is gone refuses connections, and redis-py asks the Sentinels again; one that
    is frozen (a stopped process, a paused VM, a partition) keeps the TCP connection open and
    answers nothing, so a client without ``SOCKET_TIMEOUT`` waits forever and never learns of
    the promotion (docs/reliability.md, "Redis failover").
    """
    found: list[checks.CheckMessage] = []
    for name in project_settings.rq_queue_names():
        config = project_settings.rq_queue_config(name)
        if "SENTINELS" not in config or config.get("SOCKET_TIMEOUT"):
            continue
        found.append(
            checks.Warning(
                f"RQ_QUEUES[{name!r}] uses Sentinel without SOCKET_TIMEOUT: a frozen primary "
                "holds every client of this queue (requests that enqueue, rqscheduler, the "
                "workers' bookkeeping) until it wakes up, whatever the Sentinels promoted.",
                hint=f'Add "SOCKET_TIMEOUT": 2 (seconds) to RQ_QUEUES[{name!r}], and '
                '"SENTINEL_KWARGS": {"socket_timeout": 2} (docs/settings.md, "Redis behind '
                'Sentinel").',
                id="kumiko_jobs.W006",
            )
        )
    return found


@checks.register()
def check_scheduler_class(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``RQ['SCHEDULER_CLASS']`` must be kumiko's ``Scheduler`` (or a subclass): rq-scheduler's
    own would unpickle kumiko's JSON messages and crash (E007)."""
    if conf.get_or_none() is None:
        return []  # E001 says why
    scheduler = project_settings.rq_option("SCHEDULER_CLASS")
    if names_subclass(scheduler, Scheduler):
        return []
    return [
        checks.Error(
            f"RQ['SCHEDULER_CLASS'] is {scheduler!r}; rqscheduler would try to unpickle "
            "kumiko's JSON messages and crash.",
            hint="Set RQ = {'SCHEDULER_CLASS': 'kumiko_jobs.transport.Scheduler', ...}.",
            id="kumiko_jobs.E007",
        )
    ]


# A lane's keys are ``kumiko:fair:<queue>:<level>:...`` (fair.py): a queue name holding
# ``:<digits>:`` reads as another queue's lane, and their held and set-aside lists share keys.
_LANE_LIKE = re.compile(r":-?[0-9]+:")


@checks.register()
def check_queue_names(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """No ``RQ_QUEUES`` name holds ``:<digits>:`` (E018): the fair dequeue's keys could not
    tell its lanes from another queue's, and a paused job's held messages could be released
    into the other queue."""
    return [
        checks.Error(
            f"RQ_QUEUES names the queue {name!r}, which holds {found.group()!r}: kumiko's fair "
            "dequeue keys its lanes <queue>:<priority level>:, so this queue's keys could be "
            "another queue's.",
            hint="Rename the queue without ':<digits>:' (e.g. with '-' or '_').",
            id="kumiko_jobs.E018",
        )
        for name in project_settings.rq_queue_names()
        if (found := _LANE_LIKE.search(name))
    ]
