"""Whose turn it is: the locks that make one worker at a time do the background maintenance,
and where the last turn's relay slice stopped.

Each lock is one ``SET NX EX`` that is left to expire (never released): the worker that takes it
has the turn for its seconds, whichever worker it is, and the others skip (worker/maintenance.py).
"""

from __future__ import annotations

import uuid
from typing import Any

from .keys import DEAD_SWEEP_LOCK, MAINTENANCE_LOCK, RELAY_CURSOR


def take_maintenance_turn(redis: Any, worker: str, seconds: int) -> bool:
    """Whether ``worker`` runs this maintenance round: the round's lock, taken for ``seconds``
    if no other worker holds it (one round trip)."""
    return bool(redis.set(MAINTENANCE_LOCK, worker, nx=True, ex=seconds))


def take_dead_sweep_turn(redis: Any, worker: str, seconds: int) -> bool:
    """Whether ``worker`` sweeps for the workers that stopped beating: the lock of that sweep,
    taken for ``seconds`` if no other worker holds it (one round trip)."""
    return bool(redis.set(DEAD_SWEEP_LOCK, worker, nx=True, ex=seconds))


def relay_cursor(redis: Any) -> uuid.UUID | None:
    """The run after which this round's relay slice goes on (None: from the first; also when
    Redis lost the key or holds something else, which only restarts the pass)."""
    value = redis.get(RELAY_CURSOR)
    try:
        return uuid.UUID(hex=value.decode()) if value else None
    except (ValueError, UnicodeDecodeError):
        return None


def set_relay_cursor(redis: Any, after: uuid.UUID | None, seconds: int) -> None:
    """Where the next round's slice goes on (None: from the first). It expires after
    ``seconds``: a pass left for that long starts over."""
    if after is None:
        redis.delete(RELAY_CURSOR)
    else:
        redis.set(RELAY_CURSOR, after.hex, ex=seconds)
