"""Where an enqueue comes from: correlation id, acting user and write origin of the request.

``KumikoJobsMiddleware`` stores the request in a context variable; enqueue reads it lazily,
so requests that enqueue nothing pay nothing.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse

_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
# The request path a write origin keeps (JobRun.origin["path"]): the history lists this bound
# with its column limits (history/transitions.py); it is defined here, where it is written.
ORIGIN_PATH_LIMIT = 200


@dataclass(slots=True)
class RequestOrigin:
    """The request being served and the correlation id its enqueues carry, held for the request's
    duration by ``KumikoJobsMiddleware``.
    """

    request: HttpRequest
    correlation_id: str


_current: ContextVar[RequestOrigin | None] = ContextVar("kumiko_jobs_request", default=None)


def new_correlation_id() -> str:
    """A fresh random correlation id (32 hex characters)."""
    return uuid.uuid4().hex


def request_correlation_id(request: HttpRequest) -> str:
    """The client's ``X-Request-ID`` when it is short and plain, else a fresh id: a supplied id
    lands in logs, so anything else is not adopted.
    """
    supplied = request.headers.get("X-Request-ID", "")
    # A client-supplied id is only adopted when it is short and plain: it lands in logs.
    return supplied if _REQUEST_ID_RE.match(supplied) else new_correlation_id()


def correlation_id() -> str:
    """The current request's correlation id, or a fresh one outside a request, so every enqueue has
    one to carry.
    """
    origin = _current.get()
    return origin.correlation_id if origin else new_correlation_id()


def peek_correlation_id() -> str | None:
    """The request's correlation id, or None outside a request (``correlation_id()`` would
    make up a fresh one there): for log lines, which must not invent ids."""
    origin = _current.get()
    return origin.correlation_id if origin else None


def triggered_by() -> str | None:
    """The primary key of the request's authenticated user, as text, for the run's ``triggered_by``;
    None outside a request or for an anonymous one.
    """
    origin = _current.get()
    if origin is None:
        return None
    user = getattr(origin.request, "user", None)
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return str(user.pk)


def request_origin() -> dict[str, Any] | None:
    """The write origin stamped into envelopes made during an anonymous request."""
    origin = _current.get()
    if origin is None:
        return None
    user = getattr(origin.request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return None
    return {
        "anonymous": True,
        "path": origin.request.path[:ORIGIN_PATH_LIMIT],
        "public_intake": bool(getattr(origin.request, "kumiko_public_intake", False)),
    }


class KumikoJobsMiddleware:
    """Carry the request's correlation id and user into the jobs it enqueues.

    Place it after ``AuthenticationMiddleware``. The id comes from ``X-Request-ID`` when the
    client (or a proxy) sends a plain one, and is echoed on the response.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        cid = request_correlation_id(request)
        token = _current.set(RequestOrigin(request, cid))
        try:
            response = self.get_response(request)
        finally:
            _current.reset(token)
        if "X-Request-ID" not in response:
            response["X-Request-ID"] = cid
        return response


def public_intake[F: Callable[..., Any]](view: F) -> F:
    """Mark a view as a public intake form: anonymous writes of personal data are intended."""
    import functools

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        request.kumiko_public_intake = True  # type: ignore[attr-defined]
        return view(request, *args, **kwargs)

    return wrapper  # type: ignore[return-value]
