"""The error hierarchy of kumiko_jobs: every public exception, defined once.

Errors the library raises derive from ``KumikoJobsError``; the exceptions a job raises on
purpose (``Unrecoverable``, ``TenantVisibleError``) or is interrupted with (``JobCancelled``)
do not, because they are not library failures but instructions to the runner. Defining them
here, at the bottom of the package, lets any layer raise or catch them without importing the
layer that uses them (the admin catches ``OperationRefused`` without importing the worker's
boot, and so on). Two stay elsewhere on purpose: ``tasks.TaskCancelled`` subclasses an
exception of ``django.tasks`` (absent on Django 5.2), and ``testing.TooManyRuns`` is a test
assertion, not an error. Some are re-exported where users import them: the package root and
``kumiko_jobs.operations.OperationRefused`` (docs/reference.md).
"""

from __future__ import annotations

from typing import Any


class KumikoJobsError(Exception):
    """Base class of the library's own errors; never raised directly."""


class JobNotRegistered(KumikoJobsError):
    """A job name that no installed app's ``jobs.py`` registers."""


class InvalidJob(KumikoJobsError):
    """Bad ``@job`` options, a duplicate name, non-JSON arguments or a missing tenant."""


class EnvelopeError(KumikoJobsError):
    """A queue message that is not a valid, signed envelope: it fails closed, never retried."""


class DatabaseAccessDenied(KumikoJobsError):
    """The DB guard refused a statement; the statement never reached PostgreSQL."""

    def __init__(
        self, message: str, *, job_name: str = "", kind: str = "", grant: str | None = None
    ):
        super().__init__(message)
        self.job_name = job_name
        self.kind = kind
        self.grant = grant


class BootGateFailed(KumikoJobsError):
    """A boot gate failed; the worker refuses to start (worker/boot.py)."""


class WaitTimeout(KumikoJobsError, TimeoutError):
    """``handle.wait(timeout)``: the run (or workflow) had not finished when the time was up."""


class OperationRefused(KumikoJobsError):
    """An operator action that does not apply to this run (operations.py).

    ``reason`` is a short, translatable phrase ("not failed or cancelled") that the admin
    groups and counts; the message says the same thing about one run in full.
    """

    def __init__(self, message: str, *, reason: Any):
        super().__init__(message)
        self.reason = reason


class Unrecoverable(Exception):
    """Raise from a job to fail the run at once, without further attempts."""


class JobCancelled(Exception):
    """Raised by ``ctx.check_cancelled()`` once an operator asked to cancel the running run.

    The run ends ``cancelled`` (never retried), whatever the job does after catching it.
    """


# JobFailure.message_key holds this many characters.
MESSAGE_KEY_MAX_LENGTH = 200
# What the tenant sees when a job raised TenantVisibleError with a key that cannot be stored.
FALLBACK_MESSAGE_KEY = "The job failed."


def message_key_problem(message_key: object) -> str | None:
    """Why ``message_key`` cannot be a tenant-visible failure key, or None when it can."""
    if not isinstance(message_key, str) or not message_key.strip():
        return f"the message key must be a non-empty string, got {message_key!r}"[:300]
    if len(message_key) > MESSAGE_KEY_MAX_LENGTH:
        return (
            f"the message key is {len(message_key)} characters long, over "
            f"{MESSAGE_KEY_MAX_LENGTH}: {message_key[:60]!r}..."
        )
    if "\x00" in message_key:
        return "the message key contains a NUL character"
    return None


class TenantVisibleError(Exception):
    """Raise from a job to fail with a message key the tenant may read (never the error text).

    The key is rendered through Django's i18n in the tenant admin, so it must name a sentence
    the project translates, e.g. ``"billing.sync_failed"``: a non-empty string of at most
    200 characters. A key that breaks these rules is replaced by ``FALLBACK_MESSAGE_KEY`` (the
    run still fails, and the tenant still sees a failure); ``key_problem`` and the error text
    say what was wrong, for the operator.
    """

    def __init__(self, message_key: str, *, retry: bool = False):
        self.key_problem = message_key_problem(message_key)
        self.message_key = FALLBACK_MESSAGE_KEY if self.key_problem else message_key
        self.retry = retry
        super().__init__(
            f"invalid TenantVisibleError: {self.key_problem}" if self.key_problem else message_key
        )
