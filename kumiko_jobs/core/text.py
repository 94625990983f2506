"""Text PostgreSQL can store: the one place that knows what ``text`` and ``jsonb`` refuse.

A NUL or a lone surrogate in a job's log line, an exception's message or a forged queue message
makes the row that carries it unwritable, and a history write that fails leaves a run
``running``. The run side (log lines, rendered errors) and the history (rejected messages) make
such text storable here (``storable``, escaping it); every input a person or a caller types
(job arguments, the admin's query strings and forms, the command line) is refused with the
same words instead (``text_problem``): their text is theirs to fix, not ours to rewrite.
"""

from __future__ import annotations


def storable(text: str) -> str:
    """Text PostgreSQL's text and jsonb can hold: NUL and lone surrogates escaped."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def text_problem(text: str) -> str:
    """Why PostgreSQL cannot store ``text`` as given, as a phrase ("contains a NUL character"),
    or ``""`` when it can: NUL (which text and jsonb refuse) and anything UTF-8 cannot encode
    (lone surrogates, which JSON's ``\\ud800`` escapes and undecodable command-line bytes make),
    which the driver would raise on after the input had been accepted (a 500, a traceback).
    """
    if "\x00" in text:
        return "contains a NUL character"
    if text.isascii():
        return ""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"contains a lone surrogate (U+{ord(text[exc.start]):04X}), which is not valid "
            "Unicode text"
        )
    return ""
