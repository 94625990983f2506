"""A tenants' URLconf that (by mistake) serves kumiko's guarded django-rq pages."""

from __future__ import annotations

from django.urls import path

from example_project.urls_tenant import urlpatterns as tenant_patterns
from kumiko_jobs.urls import django_rq_urls

urlpatterns = [*tenant_patterns, path("django-rq/", django_rq_urls())]
