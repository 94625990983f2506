"""The transport: the only package that imports RQ, django-rq, rq-scheduler and redis.

Every kumiko message is an RQ job whose function is ``kumiko_jobs.runner.execute`` and whose
single argument is the signed envelope string, stored with RQ's JSON serializer: no pickle
ever crosses Redis, so a forged message cannot execute code while being decoded.

This module is the face the rest of kumiko imports (``from kumiko_jobs import transport``;
``transport.push(...)``); the modules behind it own one concern each:

- ``errors``: Redis's errors, for the worker to catch (only the transport imports redis).
- ``keys``: every Redis key, prefix and hash field kumiko adds to RQ's; private to the
  transport (not on this face): other packages call the functions that use them.
- ``rq_job``: how a message is stored (``RUNNER``, the JSON job classes, hook fields).
- ``queues``: handles on the queues, their Redis, rq-scheduler's delayed set; ``Message``.
- ``pushing``: ``push`` and ``push_many``, the one way a message reaches Redis.
- ``scheduler``: ``Scheduler`` (``RQ["SCHEDULER_CLASS"]``), cron entries, the scheduler's lag.
- ``scheduler_loop``: the ``rqscheduler`` loop: due messages moved to the millisecond, never early.
- ``scheduler_liveness``: is delayed work overdue because no scheduler runs?
- ``rq_worker``: RQ's worker bases and the batched per-message bookkeeping.
- ``one_trip_dequeue``: the fair dequeue as the workers call it (``Queue.dequeue_any``).
- ``live_workers``: which kumiko worker executes which RQ job (the beats that say so).
- ``fair``, ``fair_caps`` and ``fair_policy``: the fair dequeue's script, its caps, and its
  policy as pure code.
- ``rate_limits`` and ``registries``: the slots the sweep and the relay free, and what the
  relay reads of RQ's bookkeeping.
- ``depths``: queue depths and the registered workers, for the dashboard and its metrics.
- ``maintenance_turns``: the locks that give one worker at a time the maintenance round, and
  where its relay slice stopped.
- ``worker_commands``: the Redis commands of the worker mixins (the kumiko mark, the heartbeat
  in one round trip, refused and unreadable messages).

Tests and ``kumiko_jobs.testing`` replace ``push``/``push_many`` here; ``testing`` replaces
them in ``pushing`` too, which the scheduler's cron firing calls.
"""

from __future__ import annotations

from .cap_waits import held_by_cap
from .done import note_done, signal_done, wait_for
from .errors import RedisConnectionError, RedisError, RedisTimeoutError
from .fair_policy import WEIGHT_MAX, WEIGHT_MIN, bucket_of, valid_priority, valid_weight
from .fair_rates import job_window, value_window
from .live_workers import Liveness, beat, goodbye, liveness, request_cancel, vanished_workers
from .maintenance_turns import (
    relay_cursor,
    set_relay_cursor,
    take_dead_sweep_turn,
    take_maintenance_turn,
)
from .pausing import assert_pauses
from .pushing import push, push_many
from .queues import (
    DelayedSet,
    Message,
    boot_dataset_token,
    connection_for,
    current_job_id,
    current_job_origin,
    current_priority,
    decoded,
    delayed_set,
    django_rq_urlpatterns,
    forget_queues,
    get_queue,
    queue_length,
    redis_identity,
    utcnow,
    waiting_job_ids,
)
from .rate_limits import (
    SlotHolder,
    rate_limit_slot_holders,
    release_caps_of,
    release_rate_limit_slot,
)
from .rate_windows import rate_wait_until
from .registries import HeldMessage, forget_messages, held_messages, taken_for
from .rq_job import (
    HOOK_FIELDS,
    JSON_SERIALIZER_PATH,
    RUNNER,
    JsonJob,
    Serializer,
    WorkerJob,
    is_json_serializer,
    timeout_of_job,
)
from .rq_worker import (
    BookkeepingSimpleWorker,
    DeathPenaltyBase,
    ForkingWorkerBase,
    JobTimeout,
    SimpleWorkerBase,
)
from .scheduler import (
    CronFiring,
    CronHooks,
    CronSpec,
    Scheduler,
    SchedulerLag,
    acquire_scheduler_lock,
    cancel_scheduled,
    cron_entries,
    cron_entry_id,
    cron_hooks,
    install_cron_hooks,
    missing_cron_entries,
    move_due_scheduled_jobs,
    register_cron,
    scheduled_job_ids,
    scheduler_for,
    scheduler_lag,
)
from .worker_commands import (
    fail_refused,
    hooks_in_hash,
    is_registered,
    mark_kumiko_worker,
    one_round_trip,
    remove_unreadable_job,
    unreadable_job_dump,
)

__all__ = [
    "HOOK_FIELDS",
    "JSON_SERIALIZER_PATH",
    "RUNNER",
    "WEIGHT_MAX",
    "WEIGHT_MIN",
    "BookkeepingSimpleWorker",
    "CronFiring",
    "CronHooks",
    "CronSpec",
    "DeathPenaltyBase",
    "DelayedSet",
    "ForkingWorkerBase",
    "HeldMessage",
    "JobTimeout",
    "JsonJob",
    "Liveness",
    "Message",
    "RedisConnectionError",
    "RedisError",
    "RedisTimeoutError",
    "Scheduler",
    "SchedulerLag",
    "Serializer",
    "SimpleWorkerBase",
    "SlotHolder",
    "WorkerJob",
    "acquire_scheduler_lock",
    "assert_pauses",
    "beat",
    "boot_dataset_token",
    "bucket_of",
    "cancel_scheduled",
    "connection_for",
    "cron_entries",
    "cron_entry_id",
    "cron_hooks",
    "current_job_id",
    "current_job_origin",
    "current_priority",
    "decoded",
    "delayed_set",
    "django_rq_urlpatterns",
    "fail_refused",
    "forget_messages",
    "forget_queues",
    "get_queue",
    "goodbye",
    "held_by_cap",
    "held_messages",
    "hooks_in_hash",
    "install_cron_hooks",
    "is_json_serializer",
    "is_registered",
    "job_window",
    "liveness",
    "mark_kumiko_worker",
    "missing_cron_entries",
    "move_due_scheduled_jobs",
    "note_done",
    "one_round_trip",
    "push",
    "push_many",
    "queue_length",
    "rate_limit_slot_holders",
    "rate_wait_until",
    "redis_identity",
    "register_cron",
    "relay_cursor",
    "release_caps_of",
    "release_rate_limit_slot",
    "remove_unreadable_job",
    "request_cancel",
    "scheduled_job_ids",
    "scheduler_for",
    "scheduler_lag",
    "set_relay_cursor",
    "signal_done",
    "take_dead_sweep_turn",
    "take_maintenance_turn",
    "taken_for",
    "timeout_of_job",
    "unreadable_job_dump",
    "utcnow",
    "valid_priority",
    "valid_weight",
    "value_window",
    "vanished_workers",
    "wait_for",
    "waiting_job_ids",
]
