"""At a worker's start, with ``DB_ROLES`` on: say which tenants' database roles are missing or
out of date (tenants made before ``DB_ROLES`` was turned on, a restored database, a deploy that
skipped ``manage.py kumiko_jobs roles``). Their runs would each fail at the tenant login, one
attempt spent; one warning at the start names the fix before the first of them (a newcomer's
pass: nothing said so until a run failed). The same query as check E012, one pass over the
catalogs; a database that cannot answer yet is left to the first run's own error.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError

from ..core import conf
from ..guard.roles import sync as role_sync

logger = logging.getLogger("kumiko_jobs.worker")

# How many of them the warning names; the check (E012) lists every one.
NAMED = 5


def warn_stale_roles() -> list[str]:
    """Log one warning naming what is out of date (returned), or nothing."""
    if not conf.get().DB_ROLES:
        return []
    try:
        stale = role_sync.out_of_date()
    except DatabaseError:
        return []
    if stale:
        more = f" and {len(stale) - NAMED} more" if len(stale) > NAMED else ""
        logger.warning(
            "DB_ROLES: the tenants' database roles are out of date in %d place(s) (%s%s): a "
            "tenant whose role is missing fails its runs at the login until `python manage.py "
            "kumiko_jobs roles` runs (`manage.py check --database default` lists every place: "
            "kumiko_jobs.E012)",
            len(stale),
            ", ".join(stale[:NAMED]),
            more,
        )
    return stale
