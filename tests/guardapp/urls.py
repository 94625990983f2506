"""URLconf of the write-origin tests (``override_settings(ROOT_URLCONF="tests.guardapp.urls")``)."""

from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("signup/", views.signup, name="guardapp-signup"),
    path("intake/", views.intake, name="guardapp-intake"),
]
