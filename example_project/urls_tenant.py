"""URLs of a tenant's domain: the tenant's own admin and a small demo view."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from . import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("invoices/<int:invoice_id>/sync/", views.sync_invoice_view, name="sync-invoice"),
]
