"""The error hierarchy of kumiko_jobs.

Errors the library raises derive from ``KumikoJobsError``; the two exceptions a job raises on
purpose (``Unrecoverable`` and ``TenantVisibleError``) do not, because they are not library
failures but instructions to the runner.
"""

from __future__ import annotations


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


class Unrecoverable(Exception):
    """Raise from a job to fail the run at once, without further attempts."""


class TenantVisibleError(Exception):
    """Raise from a job to fail with a message key the tenant may read (never the error text).

    The key is rendered through Django's i18n in the tenant admin, so it must name a sentence
    the project translates, e.g. ``"billing.sync_failed"``.
    """

    def __init__(self, message_key: str, *, retry: bool = False):
        super().__init__(message_key)
        self.message_key = message_key
        self.retry = retry
