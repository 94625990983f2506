"""The escape hatches' grants, defined once.

A job declares grants (``EscapeHatch(grants=[...])``, validated by the definition side), opens
them for a block (``JobContext.unsafe_raw()`` and friends, on the run side) and the guard judges
statements against the ones open (``guard.Policy.active_grants``). Three layers name the same
four words; they live here, at the foundation, so that none of those layers has to import
another to spell them, and a new grant is added in one place.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Grant"]


class Grant(StrEnum):
    """A permission a job may declare to step outside its tenant's schema (docs/guard.md).

    A ``StrEnum``: the values are the words users write in ``EscapeHatch(grants=[...])`` and the
    ones stored in the escape-hatch audit, so a member compares and hashes equal to its word.
    """

    UNSAFE_RAW = "unsafe_raw"
    GLOBAL_WRITES = "global_writes"
    CROSS_TENANT_READS = "cross_tenant_reads"
    SYSTEM_IDENTITY = "system_identity"
