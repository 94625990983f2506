"""A tenants' URLconf with the status views of ``tests.testapp.views``
(``override_settings(ROOT_URLCONF="tests.testapp.urls")``)."""

from __future__ import annotations

from django.urls import path

from example_project.urls_tenant import urlpatterns as tenant_patterns

from . import views

urlpatterns = [
    *tenant_patterns,
    path("tasks/<str:result_id>/", views.task_status, name="testapp-task-status"),
    path("runs/<str:run_id>/", views.run_status, name="testapp-run-status"),
]
