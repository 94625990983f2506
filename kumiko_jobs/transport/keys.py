"""Every Redis key, key prefix and hash field name kumiko writes besides RQ's own.

They live in one place because they are stored: a deployed worker, scheduler or relay reads
what another version wrote, so none of these strings may ever change. RQ's and rq-scheduler's
own keys stay theirs (read through their classes); these are the ones kumiko adds.
"""

from __future__ import annotations

# The id prefix of kumiko's cron entries with rq-scheduler (``kj-cron-<job name>``).
CRON_PREFIX = "kj-cron-"
# Meta field of a cron entry's job hash: the time zone its crontab is read in.
TZ_META = "kumiko_timezone"

# --- worker liveness: which kumiko worker executes which RQ job (the worker beats, the sweep
# and the relay read) ---------------------------------------------------------------------------
LIVE_WORKERS = "kumiko:workers"  # set of worker names that beat
WORKER_KEY = "kumiko:worker:"  # + name -> the RQ job id it executes ("" when idle), with a TTL
# When liveness data started to be collected in this Redis dataset. Right after a flush, or a
# restart that lost the data, no worker has beaten yet and a missing key proves nothing.
WORKERS_SINCE_KEY = "kumiko:workers:since"
# Set in a kumiko worker's RQ worker hash: a live RQ worker without it is some other worker
# class, whose runs only the timeout rule may end.
RQ_WORKER_MARK = "kumiko"

# + RQ job id -> when the relay first saw the message taken off its queue and not started.
RELAY_TAKEN = "kumiko:relay:taken:"

# --- kumiko's other keys (written by the modules named; defined here so that every stored key
# is in one file) --------------------------------------------------------------------------------
# + run id (hex) -> who asked to cancel the running run (operations; run/cancellation reads it).
CANCEL_KEY = "kumiko:cancel:"
# + run or workflow id (hex) -> a short list, the "done" signal of handle.wait() (transport/done).
DONE_KEY = "kumiko:done:"
# One worker at a time runs the maintenance round (worker/maintenance).
MAINTENANCE_LOCK = "kumiko:maintenance"
# The run id (hex) after which the next round's relay slice goes on (worker/maintenance).
RELAY_CURSOR = "kumiko:maintenance:relay-after"
# One worker at a time sweeps when a worker's beat key expired (worker/maintenance).
DEAD_SWEEP_LOCK = "kumiko:maintenance:dead"
# Its value identifies the Redis dataset that run_on_boot jobs were enqueued for (worker/boot).
BOOT_DATASET_KEY = "kumiko_jobs:boot:dataset"
# RQ RateLimit keys of the concurrency options (enqueueing/messages): + job name + ":" + owner
# for concurrency="sequential", + owner for tenant_concurrency / TENANT_CONCURRENCY.
SEQUENTIAL_LIMIT = "kumiko:seq:"
TENANT_LIMIT = "kumiko:tenant:"

# --- the fair dequeue (transport/fair.py; docs/design.md, "Flow control") ----------------------
# + queue name + ":" : the queue's lanes (+ priority level + ":"), its levels and arrival numbers.
FAIR_PREFIX = "kumiko:fair:"
# The entry that stands for a sorted message in RQ's queue list (never a job id: ids are
# [A-Za-z0-9_-]), so that RQ's count of the list is the number of waiting messages.
FAIR_TOKEN = "kumiko:fair-token"
# Sets the dequeue script reads: + "queues" (queue names), "tenants" (bucket names), "jobs"
# (job names), "jobtenants" (job name + TAB + bucket). PostgreSQL holds the truth (FlowPause).
PAUSE_PREFIX = "kumiko:pause:"
