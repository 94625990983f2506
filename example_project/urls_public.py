"""URLs of the public schema (operators): the operator admin and django-rq's queue pages."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from kumiko_jobs.urls import django_rq_urls

urlpatterns = [
    path("admin/", admin.site.urls),
    # Not include("django_rq.urls"): its views admit any staff user. kumiko's helper serves
    # them to operators holding kumiko_jobs.manage_queues, and never on a tenant's domain.
    path("django-rq/", django_rq_urls()),
]
