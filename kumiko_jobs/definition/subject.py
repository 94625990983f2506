"""The subject of a run: the tenant-visible identity of what it works on (``invoice_id=7``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.exceptions import InvalidJob
from .job import JobDefinition

_PRIMITIVES = (str, int, float, bool, type(None))
# JobRun.subject and JobFailure.subject hold this many characters.
SUBJECT_MAX_LENGTH = 255


def build_subject(definition: JobDefinition, kwargs: Mapping[str, Any]) -> str:
    """Canonical ``field=value`` pairs in declaration order; primitives only."""
    parts = []
    for name in definition.subject_fields:
        value = kwargs.get(name)
        if not isinstance(value, _PRIMITIVES):
            raise InvalidJob(
                f"Job {definition.name!r}: subject field {name!r} is a {type(value).__name__}; "
                "tenant-visible subjects must be str, int, float, bool or None."
            )
        parts.append(f"{name}={_text(value)}")
    subject = ", ".join(parts)
    if len(subject) > SUBJECT_MAX_LENGTH:
        # Cutting it would make two subjects one: a later success of the one would clear the
        # tenant-visible failure of the other (JobFailure is unique per subject).
        raise InvalidJob(
            f"Job {definition.name!r}: the tenant-visible subject {subject[:60]!r}... is "
            f"{len(subject)} characters, over {SUBJECT_MAX_LENGTH}. Make "
            f"{list(definition.subject_fields)} short values (ids, not texts)."
        )
    return subject


def _text(value: str | int | float | bool | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)
