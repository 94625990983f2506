"""The operations dashboard in the admin (docs/observability.md, "The dashboard").

``access`` (who may open what), ``data`` (the pages' numbers), ``metrics`` (the Prometheus
page), ``metrics_access`` (its bearer token, ``METRICS_TOKEN``) and ``views``
(``DashboardViews``, a base of the run admin that adds their URLs).
"""

from __future__ import annotations

from . import metrics_access as metrics_access  # registers check E016
from .views import DashboardViews

__all__ = ["DashboardViews"]
