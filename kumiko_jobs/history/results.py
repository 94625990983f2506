"""What a succeeded job returned, as its run keeps it (``JobRun.result``).

The return value is turned into JSON in ``run.entry.call_job``, right after the body, while the
run's tenant and guard are still in place: encoding can run the job's own code (a ``dict``
subclass's ``items()``, a ``list`` subclass's ``__iter__``), which must not run later in the
public schema, outside the guard. The history's finish statement then writes the plain JSON
value it gets from here.

A value that cannot be kept (not JSON, over ``MAX_RESULT_BYTES``, text PostgreSQL's ``jsonb``
refuses) does not fail a job's run: the job's effects are committed, and a retry would repeat
them. The run stays succeeded, its result is a marker saying why, and the log says so. A
Django task is held to Django's contract instead: a return value that is not JSON fails its
run (``not_json``, used by ``task_jobs``); one over the size cap is kept as the marker.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ..core import conf

logger = logging.getLogger("kumiko_jobs.results")

# The key of the marker stored instead of a result that could not be kept.
NOT_KEPT = "kumiko_result_not_kept"


class _TooLarge(Exception):
    pass


def marker(reason: str) -> dict[str, str]:
    """The value stored in place of a result that was not kept, saying why."""
    return {NOT_KEPT: reason}


def is_marker(value: Any) -> bool:
    """Whether a stored result is such a marker rather than what the job returned."""
    return isinstance(value, dict) and set(value) == {NOT_KEPT}


def storable(value: Any, limit: int) -> tuple[Any, str]:
    """``(JSON value to store, "")``, or ``(marker, why)`` when ``value`` cannot be kept.

    The size is that of the ASCII JSON text (every non-ASCII character escaped), an upper
    bound of what PostgreSQL stores. Encoding stops as soon as it passes ``limit``, so a huge
    return value costs at most ``limit`` bytes of work, never its full size.
    """
    if value is None or limit == 0:  # nothing returned, or results switched off
        return None, ""
    kept, why = _examined(value, limit)
    if why:
        why = f"the result {why}"
        return marker(why), why
    return kept, ""


def not_json(value: Any) -> str:
    """Why ``value`` is not JSON that PostgreSQL's ``jsonb`` can store (a phrase: "is not JSON:
    ...", "contains a NUL character, ..."), or "" when it is. Its size does not count: a task's
    return value must be JSON (``task_jobs``), how much of it is kept is ``storable``'s business.
    Encoding stops after ``MAX_RESULT_BYTES``, as ``storable``'s does."""
    if value is None:
        return ""
    limit = conf.get().MAX_RESULT_BYTES
    _kept, why = _examined(value, limit if limit > 0 else None)
    return "" if why == _too_large(limit) else why


def _too_large(limit: int) -> str:
    return f"is larger than MAX_RESULT_BYTES={limit}"


def _examined(value: Any, limit: int | None) -> tuple[Any, str]:
    """``(the JSON value, "")`` or ``(None, why)``, why completing "the result ..."."""
    encoder = json.JSONEncoder(allow_nan=False, ensure_ascii=True, separators=(",", ":"))
    chunks: list[str] = []
    size = 0
    try:
        for chunk in encoder.iterencode(value):
            size += len(chunk)
            if limit is not None and size > limit:
                raise _TooLarge
            chunks.append(chunk)
    except _TooLarge:
        assert limit is not None
        return None, _too_large(limit)
    except (TypeError, ValueError) as exc:  # not JSON, NaN or Infinity, a circular reference
        return None, f"is not JSON: {str(exc)[:200]}"
    except RecursionError:
        return None, "is nested too deeply for JSON"
    kept = json.loads("".join(chunks))
    problem = _jsonb_problem(kept)
    if problem:
        return None, f"{problem}, which PostgreSQL's jsonb cannot store"
    return kept, ""


def _jsonb_problem(value: Any) -> str:
    """jsonb refuses NUL characters and lone surrogates, which JSON text can carry."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            if "\x00" in item:
                return "contains a NUL character"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "contains a lone surrogate"
    return ""


def keep(run_id: str, job_name: str, value: Any) -> Any:
    """The value to store for a succeeded run; logs when it is a marker."""
    stored, why = storable(value, conf.get().MAX_RESULT_BYTES)
    if why:
        logger.warning(
            "run %s of %s succeeded, but its result was not kept: %s", run_id, job_name, why
        )
    return stored
