"""A tenants' URLconf with django-rq included the usual way, unguarded (calibration only)."""

from __future__ import annotations

from django.urls import include, path

from example_project.urls_tenant import urlpatterns as tenant_patterns

urlpatterns = [*tenant_patterns, path("django-rq/", include("django_rq.urls"))]
