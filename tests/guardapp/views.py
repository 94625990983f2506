"""Views that enqueue a personal-data write, for the write-origin tests."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from kumiko_jobs.origin import public_intake

from .jobs import save_person


@csrf_exempt
def signup(request: HttpRequest) -> JsonResponse:
    """A plain view: an anonymous visitor here is not expected to leave personal data."""
    handle = save_person.enqueue(name=request.POST["name"], email=request.POST["email"])
    return JsonResponse({"run_id": handle.run_id})


@csrf_exempt
@public_intake
def intake(request: HttpRequest) -> JsonResponse:
    """A public intake form: anonymous personal data is what it is for."""
    handle = save_person.enqueue(name=request.POST["name"], email=request.POST["email"])
    return JsonResponse({"run_id": handle.run_id})
