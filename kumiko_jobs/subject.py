"""The subject of a run: the tenant-visible identity of what it works on (``invoice_id=7``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .exceptions import InvalidJob
from .registry import JobDefinition

_PRIMITIVES = (str, int, float, bool, type(None))


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
    return ", ".join(parts)[:255]


def _text(value: str | int | float | bool | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)
