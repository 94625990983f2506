"""The suite of this directory needs its own settings (the user model is fixed per process):
collected only in the pytest process that ``tests/integration/test_admin_shared_auth.py``
starts with ``--ds tests.shared_auth.settings``."""

from __future__ import annotations

import os

SETTINGS = "tests.shared_auth.settings"

collect_ignore_glob = [] if os.environ.get("DJANGO_SETTINGS_MODULE") == SETTINGS else ["test_*.py"]
