"""How an attempt ended (``Outcome``) and who asked for a deferral (``DeferralKind``).

The runner's steps decide the outcome, the records step writes it (``JobAttempt.outcome``, the
run's status), the signals and the telemetry report it. One enum instead of string literals in
each of them: a typo is an AttributeError, not a run recorded with a status nobody handles.
Both are defined once, beside the columns that store them (``JobAttempt.Outcome`` with the run
status it leads to, ``DeferralKind`` for ``JobRun.waiting_for``), and the run side reads them
from here. Their members are ``str``: they compare, serialise and format as the stored values,
so nothing stored or sent changes.
"""

from __future__ import annotations

from ..models import DeferralKind, JobAttempt

Outcome = JobAttempt.Outcome

__all__ = ["DeferralKind", "Outcome"]
