"""Run ids: time-ordered UUIDs, made by ``new_run_id`` (the envelope's identities are derived
from them, ``envelope.py``)."""

from __future__ import annotations

import secrets
import threading
import time

_last_ms = 0
_sequence = 0
_id_lock = threading.Lock()


def new_run_id() -> str:
    """A time-ordered UUID (version 7 layout), as 32 hex digits.

    RQ's RateLimit admits waiting jobs oldest second first and breaks ties by job id; ids that
    sort by creation (a per-process sequence within a millisecond) keep waiting runs FIFO. They
    also keep the history table's primary-key index append-mostly.
    """
    global _last_ms, _sequence
    with _id_lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms, _sequence = _last_ms, _sequence + 1
            if _sequence > 0xFFF:
                ms, _sequence = ms + 1, 0
        else:
            _sequence = 0
        _last_ms = ms
        value = (ms & (2**48 - 1)) << 80 | 0x7 << 76 | _sequence << 64
        value |= 0b10 << 62 | secrets.randbits(62)
    return f"{value:032x}"
