"""How an attempt ended (``Outcome``) and who asked for a deferral (``DeferralKind``).

The runner's steps decide the outcome, the records step writes it (``JobAttempt.outcome``, the
run's status), the signals and the telemetry report it. One enum instead of string literals in
each of them: a typo is an AttributeError, not a run recorded with a status nobody handles. The
values are the strings stored in ``JobAttempt.outcome`` and sent as the signals' ``outcome=``
(a StrEnum compares and serialises as its value), so nothing stored or sent changes.
"""

from __future__ import annotations

from enum import StrEnum

from ..models import DeferralKind, RunStatus

# DeferralKind is defined beside the column that stores it (models.JobRun.waiting_for) and is
# read from here by the run side, with Outcome.
__all__ = ["DeferralKind", "Outcome"]


class Outcome(StrEnum):
    """The end of one attempt, as ``JobAttempt.outcome`` stores it."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRYING = "retrying"
    DEFERRED = "deferred"
    # Not run: a duplicate or stale message, a missing run row, an inactive tenant.
    DROPPED = "dropped"
    CANCELLED = "cancelled"

    @property
    def status(self) -> RunStatus:
        """The run's status after an attempt that ended this way (a retry waits queued; a
        dropped message leaves its run cancelled)."""
        return _STATUS[self]

    @property
    def final(self) -> bool:
        """The run ends here (it gets a ``finished_at``); retrying and deferred runs go on."""
        return self not in (Outcome.RETRYING, Outcome.DEFERRED)


_STATUS = {
    Outcome.SUCCEEDED: RunStatus.SUCCEEDED,
    Outcome.FAILED: RunStatus.FAILED,
    Outcome.RETRYING: RunStatus.QUEUED,
    Outcome.DEFERRED: RunStatus.DEFERRED,
    Outcome.DROPPED: RunStatus.CANCELLED,
    Outcome.CANCELLED: RunStatus.CANCELLED,
}
