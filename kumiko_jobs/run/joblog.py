"""``ctx.log``: the lines a job logs, kept on its attempt record and sent to the job logger.

Its own module because it owns one part of the run's state, the lines kept so far
(``AttemptLog``: the records step stores them with the attempt), and the rules that bound it:
every line scrubbed and capped, the attempt's lines capped in number and bytes, with one marker
line counting what was dropped. Nothing else writes those lines.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core import conf
from ..core.scrubbing import MASK, is_sensitive_key, scrub
from ..core.text import storable

logger = logging.getLogger("kumiko_jobs.job")


@dataclass(slots=True)
class AttemptLog:
    """The ``ctx.log`` lines the attempt keeps (its part of ``RunState``, written only here).

    ``lines`` is what the records step stores; ``size`` the bytes of JSON they take; once a
    cap is reached, ``overflow`` is the marker line (also in ``lines``) that counts the rest.
    """

    lines: list[dict[str, Any]] = field(default_factory=list)
    size: int = 0
    overflow: dict[str, Any] | None = None

    def keep(self, entry: dict[str, Any], line_limit: int, byte_limit: int) -> None:
        """Keep ``entry`` if it fits both caps, else count it on the marker line."""
        size = entry_size(entry)
        if self.overflow is None:
            if len(self.lines) < line_limit and self.size + size <= byte_limit:
                self.lines.append(entry)
                self.size += size
                return
            self.overflow = {
                "t": entry["t"],
                "level": "WARNING",
                "msg": (
                    f"ctx.log: {len(self.lines)} lines ({self.size} bytes) kept; "
                    f"later lines dropped (LOG_LINES_PER_ATTEMPT={line_limit}, "
                    f"LOG_BYTES_PER_ATTEMPT={byte_limit})"
                ),
                "data": {"dropped_lines": 0, "dropped_bytes": 0},
            }
            self.lines.append(self.overflow)
        self.overflow["data"]["dropped_lines"] += 1
        self.overflow["data"]["dropped_bytes"] += size


class JobLog:
    """``ctx.log``: lines kept on the attempt record and sent to the ``kumiko_jobs.job`` logger.

    Every line is scrubbed (values of sensitive keys masked, secrets in text hidden) and capped:
    ``LOG_LINE_BYTES`` per line, ``LOG_LINES_PER_ATTEMPT`` lines and ``LOG_BYTES_PER_ATTEMPT``
    bytes per attempt. Lines past a cap are dropped and counted on one marker line, so a job
    that logs in a loop cannot grow its attempt row (and the admin page showing it) without
    bound.
    """

    def __init__(self, kept: AttemptLog, limit: int, bound: Mapping[str, Any] | None = None):
        self._kept = kept
        self._limit = limit
        self._bound: dict[str, Any] = dict(bound or {})

    def child(self, **bound: Any) -> JobLog:
        """A log for one part of the job: every line carries ``bound`` (the call's own fields
        win on a clash). Lines go to the same attempt record, under the same caps."""
        return JobLog(self._kept, self._limit, {**self._bound, **bound})

    def _emit(self, level: int, msg: str, data: dict[str, Any]) -> None:
        if level < logging.INFO and not logger.isEnabledFor(level):
            # Debug lines follow the kumiko_jobs.job logger's level, on the attempt record too:
            # a job may log verbosely in a loop without filling its record (and scrubbing
            # costs nothing) unless someone turned debug logging on. Info and above are always
            # kept: the record is the operators' view whatever the logging setup.
            return
        if self._bound:
            data = {**self._bound, **data}
        settings = conf.get()
        entry = log_entry(level, msg, data, settings.SENSITIVE_KEYS, settings.LOG_LINE_BYTES)
        self._kept.keep(entry, self._limit, settings.LOG_BYTES_PER_ATTEMPT)
        fields = entry["data"]
        logger.log(level, "%s %s", entry["msg"], fields or "", extra={"kumiko_data": fields})

    def debug(self, msg: str, **data: Any) -> None:
        """Log a debug line; kept on the attempt only while the ``kumiko_jobs.job`` logger has debug
        on, so verbose loops cost nothing by default.
        """
        self._emit(logging.DEBUG, msg, data)

    def info(self, msg: str, **data: Any) -> None:
        """Log an info line, kept on the attempt record whatever the logging setup."""
        self._emit(logging.INFO, msg, data)

    def warning(self, msg: str, **data: Any) -> None:
        """Log a warning line, kept on the attempt record whatever the logging setup."""
        self._emit(logging.WARNING, msg, data)

    warn = warning

    def error(self, msg: str, **data: Any) -> None:
        """Log an error line, kept on the attempt record; it does not fail the run (only raising
        does).
        """
        self._emit(logging.ERROR, msg, data)


def log_entry(
    level: int, msg: object, data: Mapping[str, Any], keys: Sequence[str], line_bytes: int
) -> dict[str, Any]:
    """One ``ctx.log`` line as stored: scrubbed, and about ``line_bytes`` of JSON at most.

    The message takes what it needs of the budget first; the fields share the rest in the
    order given, and fields that no longer fit are counted in ``"…dropped_fields"``. Markers
    ("[... N more characters]", the count) may add a few dozen bytes.
    """
    text = _fitted(str(msg), keys, line_bytes)
    budget = max(0, line_bytes - entry_size(text))
    fields: dict[str, Any] = {}
    dropped = 0
    for key, value in data.items():
        name = storable(str(key))[:100]
        if is_sensitive_key(name, keys):
            shown: Any = MASK
        elif value is None or isinstance(value, bool | int | float):
            shown = _number(value)
        else:
            text_value = value if isinstance(value, str) else _repr(value)
            shown = _fitted(text_value, keys, max(budget - len(name) - 8, 1))
        cost = entry_size({name: shown})
        if cost > budget:
            dropped += 1
            continue
        fields[name] = shown
        budget -= cost
    if dropped:
        fields["…dropped_fields"] = dropped
    return {"t": time.time(), "level": logging.getLevelName(level), "msg": text, "data": fields}


def _fitted(text: str, keys: Sequence[str], budget: int) -> str:
    """``text`` scrubbed and storable, cut until its JSON takes about ``budget`` bytes.

    Cut before scrubbing (linear time); cut again when escaping grew it (a NUL becomes four
    characters, a non-ASCII one six), halving at most a few times.
    """
    limit = budget
    while True:
        fitted = storable(scrub(text, keys, limit=limit))
        if limit == 0 or entry_size(fitted) <= budget + 40:
            return fitted
        limit //= 2


def entry_size(value: Any) -> int:
    """Bytes of JSON ``value`` takes in the attempt's ``log`` column (what the caps count)."""
    # ASCII JSON: one character per byte, and never smaller than PostgreSQL's UTF-8 copy.
    return len(json.dumps(value, default=str))


def _number(value: bool | int | float | None) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        # jsonb has no NaN or Infinity: such a line would make the whole attempt unwritable.
        return repr(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        return str(value)
    return value


def _repr(value: Any) -> str:
    try:
        text = repr(value)
    except RecursionError:
        return f"<a {type(value).__name__} nested too deeply to show>"
    except Exception as exc:  # a broken __repr__ must not fail the job that logs it
        return f"<a {type(value).__name__} whose repr() raised {type(exc).__name__}>"
    return text
