"""URLs of a tenant's domain: the tenant's own admin and a small demo view."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from . import views

# No django-rq here: its pages show every tenant's messages, so they live in urls_public.py
# (operators), and RQ_SHOW_ADMIN_LINK=False keeps them off the admin site tenants share.
urlpatterns = [
    path("admin/", admin.site.urls),
    path("invoices/<int:invoice_id>/sync/", views.sync_invoice_view, name="sync-invoice"),
]
