"""A job body's exception as text, rendered where it was raised (split from ``state``, which
re-exports it: the ``Ending`` holds one)."""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from ..core.text import storable


@dataclass(frozen=True, slots=True)
class RenderedError:
    """An exception of the job body, turned into text where it was raised.

    Rendering runs the exception's own code (``__str__``, ``__repr__`` of its causes and notes):
    the ``db_guard`` step renders it while the run's tenant and the guard are still in place,
    and everything after the body (history, logs, spans) uses this text instead of rendering
    the exception again in the public schema, outside the guard.
    """

    error: BaseException
    type_name: str
    message: str
    traceback: str


def render_error(error: BaseException) -> RenderedError:
    """``error`` as text; an exception whose rendering fails still gives a message."""
    name = type(error).__name__
    try:
        message = str(error)
    except Exception as exc:  # a broken (or refused: DatabaseAccessDenied) __str__
        message = f"<the {name} could not be rendered: {type(exc).__name__}>"
    try:
        text = "".join(traceback.format_exception(error))
    except Exception as exc:
        text = f"{name}: {message}\n<traceback not rendered: {type(exc).__name__}>"
    # Storable from the start: a NUL in an exception's text made the history's final write
    # fail, which left the run ``running``.
    return RenderedError(error, name, storable(message), storable(text))
