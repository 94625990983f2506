"""Where ``import_canary`` records that it was imported (and its task that it ran)."""

from __future__ import annotations

IMPORTS: list[str] = []
