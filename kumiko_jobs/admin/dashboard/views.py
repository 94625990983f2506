"""The dashboard's pages on the run admin: URLs, access checks and responses.

``DashboardViews`` is a base of ``JobRunAdmin``: its URLs sit under the run list's
(``/admin/kumiko_jobs/jobrun/dashboard/`` ...) behind the admin site's login, and every view
asks ``access`` before it reads anything, the JSON endpoints as the pages.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.cache import add_never_cache_headers
from django.utils.translation import gettext

from ...core.audience import tenant_schema
from ...history import stats
from ...models import FlowPause
from ...transport import RedisError
from . import data, metrics
from .access import console_schema, is_operator
from .metrics_access import TokenVerdict, judge

REFRESH_SECONDS = 5


class DashboardViews(admin.ModelAdmin):  # type: ignore[type-arg]  # Django's admin classes are not subscriptable at runtime
    """The operators' dashboard, a tenant's console, their JSON, and the metrics page."""

    def get_urls(self) -> list[URLPattern]:
        """The run admin's URLs plus the dashboard's, each behind the admin site's login."""
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        views = (
            ("dashboard/", self.dashboard_view, "dashboard"),
            ("dashboard/data/", self.dashboard_data, "dashboard_data"),
            ("console/", self.console_view, "console"),
            ("console/data/", self.console_data, "console_data"),
        )
        return [
            *(
                path(url, self.admin_site.admin_view(view), name=f"{prefix}_{name}")
                for url, view, name in views
            ),
            # Not behind admin_view: a scraper with METRICS_TOKEN has no session to log in.
            path("dashboard/metrics/", self.metrics_entry, name=f"{prefix}_metrics"),
            *super().get_urls(),
        ]

    def _url(self, name: str) -> str:
        return reverse(f"{self.admin_site.name}:kumiko_jobs_jobrun_{name}")

    def _url_with(self, name: str, *args: str) -> str:
        return reverse(f"{self.admin_site.name}:kumiko_jobs_jobrun_{name}", args=args)

    def _may_bulk(self, request: HttpRequest) -> bool:
        # The run admin's BulkViews decides; a subclass without it offers no bulk links.
        may = getattr(self, "may_bulk", None)
        return bool(may and may(request))

    def _page(self, request: HttpRequest, template: str, title: str, **extra: Any) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.opts,
            "has_view_permission": True,
            "refresh_seconds": REFRESH_SECONDS,
            "runs_url": self._url("changelist"),
            **extra,
        }
        return TemplateResponse(request, template, context)

    def dashboard_link(self, request: HttpRequest) -> dict[str, str]:
        """For the run list's tools: the dashboard (operators) or the console (a tenant's
        audience), whichever this request may open; nothing for anyone else."""
        if is_operator(request):
            return {
                "kumiko_dashboard_url": self._url("dashboard"),
                "kumiko_dashboard_title": gettext("Dashboard"),
            }
        if console_schema(request, self) is not None:
            return {
                "kumiko_dashboard_url": self._url("console"),
                "kumiko_dashboard_title": gettext("Health"),
            }
        return {}

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """The operators' page; its numbers come from ``dashboard_data``."""
        if not is_operator(request):
            raise PermissionDenied
        return self._page(
            request,
            "admin/kumiko_jobs/dashboard.html",
            gettext("Jobs dashboard"),
            data_url=self._url("dashboard_data"),
            metrics_url=self._url("metrics"),
            windows=list(stats.WINDOWS),
        )

    def dashboard_data(self, request: HttpRequest) -> HttpResponse:
        """The operators' numbers as JSON, for the page's refresh."""
        if not is_operator(request):
            raise PermissionDenied
        try:
            retry = self._url_with("bulk", "retry") if self._may_bulk(request) else ""
            payload = data.operator_data(
                request.GET, self._url("changelist"), retry, **self._pause_urls(request)
            )
        except data.BadFilter as exc:
            return JsonResponse({"error": str(exc)}, status=400)
        return JsonResponse(payload)

    def _pause_urls(self, request: HttpRequest) -> dict[str, str]:
        # The pauses' admin (admin/pauses.py) decides who may pause and resume, as on its pages.
        pauses = self.admin_site._registry.get(FlowPause)
        if pauses is None:
            return {}
        name = f"{self.admin_site.name}:{self.opts.app_label}_flowpause"
        return {
            "pause_url": reverse(f"{name}_add") if pauses.has_add_permission(request) else "",
            "resume_url": (
                reverse(f"{name}_changelist") if pauses.has_delete_permission(request) else ""
            ),
        }

    def metrics_entry(self, request: HttpRequest) -> HttpResponse:
        """The metrics URL: a bearer token (``METRICS_TOKEN``) decides when one is sent, else the
        admin's login and ``metrics_view``'s operator check, as every other dashboard page."""
        verdict = judge(request)
        if verdict is TokenVerdict.ABSENT:
            return self.admin_site.admin_view(self.metrics_view)(request)
        if verdict is TokenVerdict.INVALID:
            response = HttpResponse(
                "# The bearer token is not METRICS_TOKEN (or no token is configured).\n",
                status=401,
                content_type=metrics.CONTENT_TYPE,
            )
            response["WWW-Authenticate"] = 'Bearer realm="kumiko_jobs metrics"'
        else:
            response = self._metrics_response(request)
        add_never_cache_headers(response)
        return response

    def metrics_view(self, request: HttpRequest) -> HttpResponse:
        """Prometheus' text format, for operators' sessions."""
        if not is_operator(request):
            raise PermissionDenied
        return self._metrics_response(request)

    def _metrics_response(self, request: HttpRequest) -> HttpResponse:
        try:
            body = metrics.exposition()
        except (RedisError, OSError) as exc:
            return HttpResponse(
                f"# Redis unavailable: {exc}\n", status=503, content_type=metrics.CONTENT_TYPE
            )
        return HttpResponse(body, content_type=metrics.CONTENT_TYPE)

    def console_view(self, request: HttpRequest) -> HttpResponse:
        """A tenant's console, on its own domain."""
        if console_schema(request, self) is None:
            raise PermissionDenied
        return self._page(
            request,
            "admin/kumiko_jobs/dashboard_console.html",
            gettext("Jobs health"),
            data_url=self._url("console_data"),
        )

    def console_data(self, request: HttpRequest) -> HttpResponse:
        """A tenant's numbers as JSON: its schema's runs only."""
        schema = console_schema(request, self)
        if schema is None or schema != tenant_schema():
            raise PermissionDenied
        try:
            payload = data.console_data(schema, request.GET, self._url("changelist"))
        except data.BadFilter as exc:
            return JsonResponse({"error": str(exc)}, status=400)
        return JsonResponse(payload)
