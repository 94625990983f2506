"""Who may scrape the metrics page: an operator's session, or a scraper holding the token.

Prometheus (and KEDA's Prometheus scaler) cannot log into the admin, so ``METRICS_TOKEN`` lets
a scraper send ``Authorization: Bearer <token>`` instead of a session. The token is compared in
constant time (``hmac.compare_digest``), so the time a refusal takes says nothing about how
much of a guess was right. Without a token configured the page stays what it was: operators
only, behind the admin's login. A request that sends a bearer token is judged by it alone: a
wrong one is a 401, never a fall back to the admin's login page (a scraper would read that HTML
as a success). Only on the public schema's domain, as the operators' pages.
"""

from __future__ import annotations

import hmac
from enum import Enum
from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from ...core import conf
from ...core.audience import is_operator_request

# A bearer token is a password sent on every scrape: shorter than this is guessable. 32
# characters is what ``secrets.token_urlsafe(24)`` gives.
MIN_TOKEN_LENGTH = 32
_SCHEME = "bearer"


class TokenVerdict(Enum):
    """What a request's ``Authorization`` header says about the metrics page."""

    ABSENT = "absent"  # no bearer token sent: the admin's session decides, as before
    VALID = "valid"
    INVALID = "invalid"  # sent, and wrong (or no token configured, or a tenant's domain)


def _bearer(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != _SCHEME:
        return None
    return value.strip()


def judge(request: HttpRequest) -> TokenVerdict:
    """The request's bearer token against ``METRICS_TOKEN``, compared in constant time."""
    sent = _bearer(request)
    if sent is None:
        return TokenVerdict.ABSENT
    expected = conf.get().METRICS_TOKEN
    if not expected or not sent or not is_operator_request():
        return TokenVerdict.INVALID
    if hmac.compare_digest(sent.encode(), expected.encode()):
        return TokenVerdict.VALID
    return TokenVerdict.INVALID


@checks.register(checks.Tags.security)
def check_metrics_token(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``METRICS_TOKEN`` shorter than ``MIN_TOKEN_LENGTH`` characters (E016)."""
    try:
        token = conf.get().METRICS_TOKEN
    except ImproperlyConfigured:
        return []  # E001 says why
    if token is None or len(token) >= MIN_TOKEN_LENGTH:
        return []
    return [
        checks.Error(
            f"KUMIKO_JOBS['METRICS_TOKEN'] has {len(token)} characters: a bearer token that "
            f"short can be guessed by a scraper that tries.",
            hint=f"Use at least {MIN_TOKEN_LENGTH} random characters, e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))', kept in the "
            "environment, not in the code.",
            id="kumiko_jobs.E016",
        )
    ]
