"""Check every SQL statement of the job body against the grants the job opened.

The step puts the guard (``guard.install.GuardSession``, which installs
``guard.wrapper.GuardWrapper`` with ``connection.execute_wrapper`` on every database alias)
around the job body only: the runner's own history writes happen outside it. The guard itself
reads and writes only the run's ``Watch`` (``guard.watch``), never the run state; this step is
where the run meets it: it chooses the mode (``DB_GUARD``), hands the guard the audit of the
grants' uses, and renders the body's error while still inside the guard and the tenant.
"""

from __future__ import annotations

import functools

from ...core import conf
from ...guard.install import GuardSession
from ...history import audit
from ..pipeline import Next
from ..rendered_errors import render_error
from ..state import RunState


def db_guard(state: RunState, call_next: Next) -> None:
    """The pipeline step: the body runs under the guard (or, with ``DB_GUARD="off"``, without)."""
    mode = conf.get().DB_GUARD
    if mode == "off":
        _call_body(state, call_next)
        return
    # The guard reads only the run's Watch; the audit of a grant's use needs the whole run.
    report = functools.partial(audit.record_use, state)
    with GuardSession(state.watch, enforce=mode == "enforce", report_use=report):
        _call_body(state, call_next)


def _call_body(state: RunState, call_next: Next) -> None:
    try:
        call_next(state)
    except BaseException as exc:
        # Rendered here, in the run's tenant and under the guard: ``str()`` and the traceback
        # run the exception's own code, which must not run later in public, unguarded.
        state.ending.note_rendered(render_error(exc))
        raise
