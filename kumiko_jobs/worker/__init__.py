"""RQ workers with per-run hygiene and JSON-only messages.

``Worker`` (the default, set ``RQ["WORKER_CLASS"] = "kumiko_jobs.worker.Worker"``) runs jobs in
the worker process like RQ's ``SimpleWorker``: about five times the throughput of forking
for short database jobs, because the connection is reused. Its cost is that a run could leak
state into the next one, so after every run it goes back to the public schema and drops
connections the run left unusable.

``ForkingWorker`` keeps RQ's fork-per-job isolation. The parent closes its database
connections before forking (a socket shared by two processes corrupts both), and the work
horse flushes telemetry before it exits.

Both refuse any queue message that is not a call of the runner with one argument. Whoever can
write to Redis can name any importable function in an RQ message (``os.system`` with JSON
arguments), and RQ would call it; a kumiko worker records such a message as a
``RejectedMessage``, fails it in RQ without calling anything, and goes on. A job hash RQ cannot
even load is recorded and removed instead of stopping the worker.

Both also keep their runs accounted for (docs/reliability.md): a small thread beats a liveness
key in Redis naming the RQ job the worker executes, so the sweep can tell a run whose worker
died (SIGKILL, OOM, a lost machine) from one that is merely long, within ``WORKER_DEAD_AFTER``
seconds instead of the job's timeout; a second thread runs the sweep and the outbox relay every
``MAINTENANCE_INTERVAL`` seconds, one worker at a time. A Redis outage does not end a worker: it
waits and reconnects. A cold shutdown of the in-process worker is handled like a crash.

A timeout is final (docs/reliability.md, Timeouts): their death penalty notes on the run that
its timeout fired, so a job that swallows RQ's timeout exception is still recorded as timed out
(``run.entry.call_job``); and a watchdog thread ends an attempt still running ``TIMEOUT_KILL_AFTER``
seconds after its timeout: ``ForkingWorker`` kills the work horse, ``Worker`` records the attempt
and exits, as after a crash, for its supervisor to restart it.

Where each concern lives: classes.py (the two classes, and what differs between them);
foreign.py (refusing foreign and malformed messages); keeps_alive.py (surviving a Redis
outage); heart.py (the liveness beat and the watchdog); timeouts.py (the final timeout);
maintenance.py (the background rounds of sweep.py and relay.py); boot.py (boot gates and jobs).
This module is the face: ``kumiko_jobs.worker.Worker`` and ``ForkingWorker`` are named in users'
settings, and ``refusal`` is what a message must pass.
"""

from __future__ import annotations

from .classes import ForkingWorker, Worker
from .foreign import refusal

__all__ = ["ForkingWorker", "Worker", "refusal"]
