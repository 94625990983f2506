"""Text PostgreSQL can store: the one place that escapes what ``text`` and ``jsonb`` refuse.

A NUL or a lone surrogate in a job's log line, an exception's message or a forged queue message
makes the row that carries it unwritable, and a history write that fails leaves a run
``running``. The run side (log lines, rendered errors) and the history (rejected messages) all
make their text storable here, below both of them.
"""

from __future__ import annotations


def storable(text: str) -> str:
    """Text PostgreSQL's text and jsonb can hold: NUL and lone surrogates escaped."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
