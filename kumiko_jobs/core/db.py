"""Names kumiko's own database objects carry, shared by the code that uses them and the guard.

Constants only, no imports: the admission lock's table is written by the enqueue side and kept
from tenant SQL by the guard's classifier; the atomic success function (migrations 0011 and
0017) is called by the run's history and granted to the tenants' roles by
``guard.roles.privileges``. Living here, neither of those imports the other.
"""

from __future__ import annotations

# kumiko's admission lock is a row lock on this table (models.AdmissionLock; migration 0017):
# tenant logins hold no privilege on it, and the classifier refuses any statement naming it.
ADMISSION_LOCK_TABLE = "kumiko_jobs_admissionlock"

# The two-int4 advisory key class kumiko's admission lock used before migration 0017. Still
# refused to tenant SQL (rule protected), so that a worker of the previous release, which takes
# the advisory lock during a rolling deploy, cannot be blocked by a tenant run of this one.
ADMISSION_LOCK_CLASS = 0x4B4A  # "KJ"

# Created by migration 0011, replaced by 0017 and 0029 (SECURITY DEFINER, owned by the project
# user); its signature. The sixth argument is the attempt's key, the seventh the attempt's finish
# written in the same transaction (run/steps/atomic.py).
ATOMIC_FUNCTION = "kumiko_jobs_atomic_success"
ATOMIC_SIGNATURE = "(uuid, integer, xid8, timestamptz, jsonb, text, jsonb)"

# The dashboard's rollups (migrations 0024, 0025 and 0026): tables without a model, written only by
# the workers' maintenance round (history/rollup.py). Without a model the guard would not know
# them as kumiko's: it keeps them from tenant SQL as it keeps the models' tables
# (guard/tables.py), whatever a run's grants.
ROLLUP_TABLE = "kumiko_jobs_runrollup"
ROLLUP_MARK_TABLE = "kumiko_jobs_runrollupmark"
WORKER_TIME_TABLE = "kumiko_jobs_workertimerollup"
TENANT_DAY_TABLE = "kumiko_jobs_tenantdayrollup"
TABLES_WITHOUT_MODELS = (ROLLUP_TABLE, ROLLUP_MARK_TABLE, WORKER_TIME_TABLE, TENANT_DAY_TABLE)
