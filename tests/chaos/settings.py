"""The test settings, plus the network options a chaos test hands its worker processes.

``KUMIKO_CHAOS_REDIS_OPTIONS`` (JSON, redis-py's keyword names, e.g. ``{"socket_timeout": 2}``)
goes into the query string of every RQ_QUEUES ``URL``: with ``URL`` django-rq passes nothing
else to redis-py (its ``SOCKET_TIMEOUT`` key counts only with HOST/PORT).
``KUMIKO_CHAOS_DB_OPTIONS`` (JSON) goes into every database's OPTIONS (libpq's, e.g.
``{"keepalives_idle": 5}``): the settings docs/reliability.md recommends, applied to a worker
behind tests/chaos/proxy.py. ``KUMIKO_CHAOS_EVERY_SECOND=1`` installs tests/chaos/cron_app (a
cron job ticking every second) for test_chaos_cron's schedulers.
"""

from __future__ import annotations

import json
import os
from urllib.parse import urlencode

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, INSTALLED_APPS, RQ_QUEUES, SHARED_APPS

_redis = json.loads(os.environ.get("KUMIKO_CHAOS_REDIS_OPTIONS") or "{}")
_db = json.loads(os.environ.get("KUMIKO_CHAOS_DB_OPTIONS") or "{}")
for _queue in RQ_QUEUES.values():
    if _redis and "URL" in _queue:
        _queue["URL"] = f"{_queue['URL']}?{urlencode(_redis)}"
for _database in DATABASES.values():
    _database["OPTIONS"] = {**_database.get("OPTIONS", {}), **_db}
if os.environ.get("KUMIKO_CHAOS_EVERY_SECOND") == "1":
    SHARED_APPS = [*SHARED_APPS, "tests.chaos.cron_app"]
    INSTALLED_APPS = [*INSTALLED_APPS, "tests.chaos.cron_app"]
