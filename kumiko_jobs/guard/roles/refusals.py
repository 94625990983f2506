"""PostgreSQL's refusals are the run's denials (docs/guard.md, "Two walls").

Under ``DB_ROLES`` the body's login holds no privilege outside its tenant, so PostgreSQL refuses
what the classifier missed with ``permission denied``. Such a refusal is recorded on the run (the
run fails even if the job catches it) wherever psycopg raised it: psycopg builds every exception
for a server error in one function, wrapped here once per process; the tenant login's cursor
class (``recording``) also raises it as the run's ``DatabaseAccessDenied``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cache
from typing import Any

from psycopg import errors

from .. import denials
from ..watch import current_watch

__all__ = ["recording"]


# psycopg's one constructor of the exceptions it raises for a server error, on every psycopg
# route: Django's cursors, ``connection.connection.execute``, a hand-built ``psycopg.Cursor``,
# ``copy()``, ``stream()``, pipelines. Wrapped once, in this process, so that a ``permission
# denied`` PostgreSQL sends a tenant login is recorded on the run wherever it was raised, even
# when the job catches it (a hand-built cursor never passed the wrapped cursor class below).
# Not seen: a result read from libpq itself (``pgconn.exec_()``), which raises nothing.
_error_from_result = errors.error_from_result


def _error_noting_denials(result: Any, encoding: str = "utf-8") -> Any:
    error = _error_from_result(result, encoding)
    if isinstance(error, errors.InsufficientPrivilege):
        _note_denial(error)
    return error


if getattr(errors.error_from_result, "__name__", "") != _error_noting_denials.__name__:
    errors.error_from_result = _error_noting_denials


def _note_denial(exc: errors.InsufficientPrivilege) -> None:
    """A ``permission denied`` raised in a tenant body running as its tenant's login: a
    violation of the run (it fails even if the job catches it)."""
    watch = current_watch()
    if watch is None or watch.schema is None:
        return
    if watch.db_identity is None and not watch.inline_role:
        return
    message = denials.record_privilege_denial(watch, str(exc.diag.message_primary or exc))
    exc.kumiko_denial = message  # type: ignore[attr-defined]  # read by _denial below


def _denial(exc: errors.InsufficientPrivilege) -> BaseException:
    """The run's denial for ``exc`` (noted by ``_note_denial``); ``exc`` outside a tenant body."""
    message = getattr(exc, "kumiko_denial", None)
    watch = current_watch()
    if message is None or watch is None:
        return exc
    return denials.privilege_denied(watch, message)


@cache
def recording(base: type) -> type:
    """``base`` (psycopg's cursor class of the connection), raising a ``permission denied``
    as the run's ``DatabaseAccessDenied`` on the routes Django and the connection's own cursors
    take: Django's cursors, ``connection.connection.execute``, ``copy()``, ``stream()``, named
    cursors (the denial is recorded on every route, see ``_error_noting_denials``)."""

    class Recording(base):  # type: ignore[misc]  # psycopg's cursor class, known at run time
        def execute(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().execute(*args, **kwargs)
            except errors.InsufficientPrivilege as exc:
                raise _denial(exc) from exc

        def executemany(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().executemany(*args, **kwargs)
            except errors.InsufficientPrivilege as exc:
                raise _denial(exc) from exc

        @contextlib.contextmanager
        def copy(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
            try:
                with super().copy(*args, **kwargs) as copy:
                    yield copy
            except errors.InsufficientPrivilege as exc:
                raise _denial(exc) from exc

        def stream(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
            try:
                yield from super().stream(*args, **kwargs)
            except errors.InsufficientPrivilege as exc:
                raise _denial(exc) from exc

    Recording.__name__ = Recording.__qualname__ = f"Recording{base.__name__}"
    return Recording
