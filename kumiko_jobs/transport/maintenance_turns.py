"""Whose turn it is: the locks that make one worker at a time do the background maintenance.

Each is one ``SET NX EX`` that is left to expire (never released): the worker that takes it has
the turn for its seconds, whichever worker it is, and the others skip (worker/maintenance.py).
"""

from __future__ import annotations

from typing import Any

from .keys import DEAD_SWEEP_LOCK, MAINTENANCE_LOCK


def take_maintenance_turn(redis: Any, worker: str, seconds: int) -> bool:
    """Whether ``worker`` runs this maintenance round: the round's lock, taken for ``seconds``
    if no other worker holds it (one round trip)."""
    return bool(redis.set(MAINTENANCE_LOCK, worker, nx=True, ex=seconds))


def take_dead_sweep_turn(redis: Any, worker: str, seconds: int) -> bool:
    """Whether ``worker`` sweeps for the workers that stopped beating: the lock of that sweep,
    taken for ``seconds`` if no other worker holds it (one round trip)."""
    return bool(redis.set(DEAD_SWEEP_LOCK, worker, nx=True, ex=seconds))
