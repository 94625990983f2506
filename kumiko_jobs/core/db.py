"""Names kumiko's own database objects carry, shared by the code that uses them and the guard.

Constants only, no imports: the admission lock's advisory-key class is taken by the enqueue
side's lock and kept from tenant SQL by the guard's classifier; the atomic success function
(migration 0011) is called by the run's history and granted to the tenants' roles by
``guard.role_grants``. Living here, neither of those imports the other.
"""

from __future__ import annotations

# kumiko's own admission lock uses the two-int4 advisory key space with this class id
# (pg_advisory_xact_lock(ADMISSION_LOCK_CLASS, hashtext(...))). Tenant SQL may use the two-int
# form only with a constant first argument different from this one (see guard docs).
ADMISSION_LOCK_CLASS = 0x4B4A  # "KJ"

# Created by migration 0011 (SECURITY DEFINER, owned by the project user); its signature.
ATOMIC_FUNCTION = "kumiko_jobs_atomic_success"
ATOMIC_SIGNATURE = "(uuid, integer, xid8, timestamptz, jsonb)"
