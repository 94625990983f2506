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

``check_django_rq_exposure`` (registered at import: ``kumiko_jobs.checks`` imports this module
at start-up) fails ``manage.py check`` when django-rq's views are reachable another way
(``include("django_rq.urls")``, or ``RQ_SHOW_ADMIN_LINK`` left on).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.views import redirect_to_login
from django.core import checks
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, get_resolver

from . import transport
from .core import project_settings
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


@checks.register(checks.Tags.security, checks.Tags.urls)
def check_django_rq_exposure(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """django-rq's pages show and delete every tenant's messages: operators only.

    Its views admit any ``is_staff`` user, and django-tenants serves the same admin site and the
    same views on every tenant's domain; ``kumiko_jobs.urls.django_rq_urls()`` is the guarded way
    to serve them.
    """
    # Imported when the check runs, as before the move: a project without django.contrib.admin
    # still imports this module.
    from django.contrib.admin.sites import all_sites

    errors: list[checks.CheckMessage] = []
    for site in list(all_sites):
        if any(model._meta.app_label == "django_rq" for model in site._registry):
            errors.append(
                checks.Error(
                    f"django-rq's pages are registered on the admin site {site.name!r} "
                    "(RQ_SHOW_ADMIN_LINK defaults to True): any staff user, a tenant's too on "
                    "the tenant's domain, can read, delete and empty every tenant's queue.",
                    hint="Set RQ_SHOW_ADMIN_LINK = False and serve the pages with "
                    'path("django-rq/", kumiko_jobs.urls.django_rq_urls()) in the public '
                    "schema's URLconf.",
                    id="kumiko_jobs.E008",
                )
            )
    for urlconf in project_settings.urlconf_names():
        exposed = sorted(set(_unguarded_django_rq_routes(urlconf)))
        if exposed:
            errors.append(
                checks.Error(
                    f"{urlconf} serves django-rq's views without kumiko's guard "
                    f"({', '.join(exposed[:3])}{', ...' if len(exposed) > 3 else ''}): they "
                    "admit any staff user, on tenants' domains too.",
                    hint='Replace include("django_rq.urls") with '
                    "kumiko_jobs.urls.django_rq_urls() (operators' domain, permission "
                    "kumiko_jobs.manage_queues).",
                    id="kumiko_jobs.E009",
                )
            )
    return errors


def _unguarded_django_rq_routes(urlconf: str) -> list[str]:
    found: list[str] = []

    def walk(patterns: Any, prefix: str) -> None:
        for entry in patterns:
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, prefix + str(entry.pattern))
            elif isinstance(entry, URLPattern):
                module = getattr(entry.callback, "__module__", "") or ""
                if module.startswith("django_rq") and not is_guarded(entry.callback):
                    found.append(prefix + str(entry.pattern))

    try:
        walk(get_resolver(urlconf).url_patterns, "")
    except Exception:  # a broken URLconf is reported by Django's own checks
        return []
    # Views of django-rq's admin link are reported by E008.
    return [route for route in found if "django_rq/dashboard" not in route]
