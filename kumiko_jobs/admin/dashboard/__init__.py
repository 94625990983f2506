"""The operations dashboard in the admin (docs/observability.md, "The dashboard").

``access`` (who may open what), ``data`` (the pages' numbers), ``metrics`` (the Prometheus
page) and ``views`` (``DashboardViews``, a base of the run admin that adds their URLs).
"""

from __future__ import annotations

from .views import DashboardViews

__all__ = ["DashboardViews"]
