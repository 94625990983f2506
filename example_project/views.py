from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from example_project.billing.jobs import sync_invoice


@csrf_exempt
def sync_invoice_view(request: HttpRequest, invoice_id: int) -> JsonResponse:
    """Enqueue a sync for an invoice of the current tenant (the request's domain)."""
    handle = sync_invoice.enqueue(invoice_id=invoice_id)
    return JsonResponse({"run_id": handle.run_id, "tenant": handle.schema_name})
