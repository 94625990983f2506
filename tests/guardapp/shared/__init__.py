"""A shared app of the guard suites: its tables live in public only (SHARED_APPS, not
TENANT_APPS), one of them with an upper-case ``db_table`` (issue 22)."""

from __future__ import annotations
