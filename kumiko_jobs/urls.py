"""django-rq's queue pages for operators only: ``path("django-rq/", django_rq_urls())``.

django-rq's own views admit any ``is_staff`` user, and its admin link registers them on
``admin.site``, which django-tenants serves on every tenant's domain too: a tenant's staff user
could read every tenant's messages, delete them, empty queues and drop cron entries. The pages
show raw queue contents (every tenant's arguments), so kumiko serves them only

* on the public schema's domain (a tenant's domain gets a 404: the pages do not exist there,
  whichever URLconf includes them), and
* to users holding ``kumiko_jobs.manage_queues`` (superusers hold every permission); django-rq
  still requires ``is_staff`` on top.

The JSON stats and Prometheus endpoints keep django-rq's API token (``RQ_API_TOKEN``): a request
that carries a token is judged by the token alone, not by the session's ``is_staff``.

``checks.py`` fails ``manage.py check`` when django-rq's views are reachable another way
(``include("django_rq.urls")``, or ``RQ_SHOW_ADMIN_LINK`` left on).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern

from . import transport
from .core.audience import MANAGE_QUEUES, is_operator_request

# Set on every view this module guards; the system check looks for it.
GUARD_MARK = "kumiko_operators_only"

View = Callable[..., HttpResponse]


def operators_only(view: View, *, token_auth: bool = False) -> View:
    """Serve ``view`` on the operators' domain to holders of ``manage_queues`` only."""

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not is_operator_request():
            raise Http404
        if token_auth and _carries_token(request, kwargs):
            # django-rq admits ``is_staff or token``: with the session user hidden, only a
            # valid token gets through.
            request.user = AnonymousUser()
            return view(request, *args, **kwargs)
        user = request.user
        if not user.is_authenticated:
            return redirect_to_login(request.get_full_path(), "admin:login")
        if not user.has_perm(MANAGE_QUEUES):
            raise PermissionDenied
        return view(request, *args, **kwargs)

    setattr(guarded, GUARD_MARK, True)
    return guarded


def _carries_token(request: HttpRequest, kwargs: dict[str, Any]) -> bool:
    return bool(kwargs.get("token")) or request.headers.get("Authorization", "").startswith(
        "Bearer "
    )


def django_rq_patterns() -> list[URLPattern]:
    """django-rq's URL patterns, every view guarded by :func:`operators_only`."""
    api, pages = transport.django_rq_urlpatterns()
    for pattern in api:
        pattern.callback = operators_only(pattern.callback, token_auth=True)
    return [*api, *(_guard(p) for p in pages)]


def _guard(pattern: URLPattern) -> URLPattern:
    pattern.callback = operators_only(pattern.callback)
    return pattern


def django_rq_urls() -> tuple[list[URLPattern], str, str]:
    """For ``path("django-rq/", django_rq_urls())`` in the public schema's URLconf.

    Namespaced ``django_rq`` like ``include("django_rq.urls")``, which django-rq's templates
    reverse against.
    """
    return (django_rq_patterns(), "django_rq", "django_rq")


def is_guarded(callback: Any) -> bool:
    """Whether a view is wrapped by kumiko's guard for django-rq's pages: the system checks use it
    to find django-rq views served without it.
    """
    return bool(getattr(callback, GUARD_MARK, False))
