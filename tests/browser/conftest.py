"""The browser tests' served project (tests/browser/support.py has the rest they share)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def server(live_db: None) -> Iterator[int]:
    """A real HTTP server in a thread, serving the project and its static files; the port.

    Not pytest-django's live_server: it assumes its own database handling, while these tests
    need live_db's real commits (the worker and the server threads see the same rows). Chromium
    resolves ``*.localhost`` to the loopback address by itself, so ``localhost`` reaches the
    public schema and ``t1.localhost`` tenant t1, as django-tenants routes production hosts.
    """
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.test.testcases import LiveServerThread

    thread = LiveServerThread("127.0.0.1", StaticFilesHandler)
    thread.daemon = True
    thread.start()
    thread.is_ready.wait(timeout=10)
    if thread.error:
        raise thread.error
    yield thread.port
    thread.terminate()
