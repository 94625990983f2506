"""Changelist query strings that cannot be served are refused with 400 Bad Request.

Django's admin validates the lookups of a query string, but not its text: a NUL reaches the
database driver (a 500), and a huge search term runs as LIKE patterns over every row. Every
changelist of ours mixes in ``CleanQueryStrings``.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.utils.translation import gettext

# Longer filter or search values than any job name, subject or reason: refused before they cost
# a query (a 200 KB search term would otherwise run as LIKE patterns over every row).
MAX_QUERY_VALUE = 1000


def bad_query_string(params: Any) -> str:
    """Why a changelist query string cannot be served, or ``""`` if it can.

    PostgreSQL refuses text with NUL characters, and the driver raises on them *after* the
    admin has validated the lookups: without this, ``?job=%00`` or ``?q=%00`` is a 500 (and on
    a debug server a page of settings). Refused as a whole, whatever parameter carries it.
    """
    for key, values in params.lists():
        for text in (key, *values):
            if "\x00" in text:
                return gettext("Query parameters cannot contain NUL characters.")
            if len(text) > MAX_QUERY_VALUE:
                return gettext("A query parameter is longer than %(max)d characters.") % {
                    "max": MAX_QUERY_VALUE
                }
    return ""


class CleanQueryStrings:
    """Changelists answer a malformed query string with 400 Bad Request, never a 500."""

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Answer a query string with NUL characters or over-long values with 400 Bad Request before
        Django runs it, instead of a 500 from the driver or a LIKE scan of every row.
        """
        problem = bad_query_string(request.GET)
        if problem:
            return HttpResponseBadRequest(problem, content_type="text/plain; charset=utf-8")
        response: HttpResponse = super().changelist_view(  # type: ignore[misc]
            request, extra_context
        )
        return response
