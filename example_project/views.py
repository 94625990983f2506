from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from example_project.billing.jobs import sync_invoice


@require_POST
def sync_invoice_view(request: HttpRequest, invoice_id: int) -> JsonResponse:
    """Enqueue a sync for an invoice of the current tenant (the request's domain).

    A state change: POST only (a GET gets 405, so links, prefetchers and crawlers change
    nothing), CSRF-checked by the middleware, and by signed-in users of this tenant only (users
    live in the tenant's schema, so another tenant's session is not one here).
    """
    if not request.user.is_authenticated:
        return JsonResponse({"error": "sign in first"}, status=403)
    handle = sync_invoice.enqueue(invoice_id=invoice_id)
    return JsonResponse({"run_id": handle.run_id, "tenant": handle.schema_name})
