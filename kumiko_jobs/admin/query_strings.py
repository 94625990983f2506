"""What one admin list request may cost: refused query strings, bounded searches, a statement
timeout.

Django's admin validates the lookups of a query string, but not its text: a NUL or a lone
surrogate reaches the database driver (a 500), a huge search term runs as LIKE patterns over
every row, and thousands of search words make each row cost thousands of comparisons. Every
changelist of ours mixes in ``CleanQueryStrings``, which refuses such requests with 400 Bad
Request before they cost a query, runs the list's statements under ``ADMIN_STATEMENT_TIMEOUT_MS``
and answers a list that hit it with a sentence, not a 500. The same checks guard every other
caller of a search (``checked_search``: Django's ``/admin/autocomplete/`` calls
``get_search_results`` without passing through the changelist).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.views.main import SEARCH_VAR
from django.core.exceptions import BadRequest, ValidationError
from django.db import OperationalError, connection, transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import SimpleTemplateResponse
from django.utils.text import smart_split, unescape_string_literal
from django.utils.translation import gettext, ngettext

from ..core import conf
from ..core.text import text_problem

# Longer filter or search values than any job name, subject or reason: refused before they cost
# a query (a 200 KB search term would otherwise run as LIKE patterns over every row).
MAX_QUERY_VALUE = 1000
# Every search word is a condition on every row a search reads (and for an operator, one per
# index that answers it): 2,000 one-letter words kept the database busy 90 s for one request.
# Searches people type have two or three words, of a subject's value or an id. The cap, not the
# statement timeout, is what bounds such a search: an operator's 2,000-word search (before the
# cap) ran over ten minutes and grew to 2 GB in one backend, and neither pg_cancel_backend (the
# signal statement_timeout sends) nor pg_terminate_backend stopped it until it was done.
MAX_SEARCH_WORDS = 10
MAX_SEARCH_WORD_CHARS = 100

# PostgreSQL's SQLSTATE for a statement cancelled by statement_timeout (query_canceled).
_QUERY_CANCELED = "57014"
# Set on the request while its list runs under the statement timeout (nested callers skip it).
_BOUNDED_ATTRIBUTE = "kumiko_jobs_statement_timeout"


def bad_query_string(params: Any) -> str:
    """Why a changelist query string cannot be served, or ``""`` if it can.

    PostgreSQL refuses text with NUL characters, and the driver raises on them and on lone
    surrogates *after* the admin has validated the lookups: without this, ``?job=%00`` or
    ``?q=%00`` is a 500 (and on a debug server a page of settings). Refused as a whole,
    whatever parameter carries it.
    """
    for key, values in params.lists():
        for text in (key, *values):
            if text_problem(text):
                return gettext(
                    "Query parameters cannot contain NUL characters or lone surrogates "
                    "(text that is not valid Unicode)."
                )
            if len(text) > MAX_QUERY_VALUE:
                return gettext("A query parameter is longer than %(max)d characters.") % {
                    "max": MAX_QUERY_VALUE
                }
    return ""


def search_words(search_term: str) -> list[str]:
    """The words of a search, as Django's admin splits them (quotes keep spaces)."""
    words = []
    for word in smart_split(search_term):
        if word.startswith(('"', "'")) and word[0] == word[-1]:
            word = unescape_string_literal(word)
        if word:
            words.append(word)
    return words


def bad_search(search_term: str) -> str:
    """Why a search cannot be run, or ``""``: its text (``bad_query_string``'s rules), more than
    ``MAX_SEARCH_WORDS`` words, or a word longer than ``MAX_SEARCH_WORD_CHARS``."""
    if text_problem(search_term):
        return gettext(
            "A search cannot contain NUL characters or lone surrogates (text that is not "
            "valid Unicode)."
        )
    if len(search_term) > MAX_QUERY_VALUE:
        return gettext("A query parameter is longer than %(max)d characters.") % {
            "max": MAX_QUERY_VALUE
        }
    words = search_words(search_term)
    if len(words) > MAX_SEARCH_WORDS:
        return ngettext(
            "Search for at most %(max)d word; narrow the list with its filters instead.",
            "Search for at most %(max)d words; narrow the list with its filters instead.",
            MAX_SEARCH_WORDS,
        ) % {"max": MAX_SEARCH_WORDS}
    if any(len(word) > MAX_SEARCH_WORD_CHARS for word in words):
        return gettext(
            "A search word is longer than %(max)d characters; search for a part of it."
        ) % {"max": MAX_SEARCH_WORD_CHARS}
    return ""


def bad_selection(model: Any, post: Any) -> str:
    """Why an action's POST cannot be served, or ``""``: a ticked row's id that is not an id of
    ``model`` (Django's action filters ``pk__in`` with it, and a text that is not a UUID makes
    that a 500)."""
    pk = model._meta.pk
    for value in post.getlist(ACTION_CHECKBOX_NAME):
        if text_problem(value) or len(value) > MAX_QUERY_VALUE:
            return gettext("A selected row's id is not an id of this list.")
        try:
            pk.to_python(value)
        except ValidationError:
            return gettext("A selected row's id is not an id of this list.")
    return ""


def checked_search(request: HttpRequest, search_term: str) -> None:
    """Refuse, as 400 Bad Request (Django's ``BadRequest``), a search that the changelist's own
    checks would refuse, whoever calls ``get_search_results``: the autocomplete view passes its
    ``term`` here without the changelist's checks."""
    problem = bad_query_string(request.GET) or bad_search(search_term)
    if problem:
        raise BadRequest(problem)


def statement_timeout_ms() -> int:
    """``ADMIN_STATEMENT_TIMEOUT_MS`` (0: no timeout)."""
    return conf.get().ADMIN_STATEMENT_TIMEOUT_MS


@contextmanager
def bounded_statements(request: HttpRequest) -> Iterator[None]:
    """Run the block in a transaction whose statements PostgreSQL cancels after
    ``ADMIN_STATEMENT_TIMEOUT_MS`` (``SET LOCAL``: it ends with the transaction, so a kept
    connection carries nothing to the next request). Inside another transaction (Django's
    ``ATOMIC_REQUESTS``) the earlier timeout is put back afterwards. A no-op when the request
    already runs bounded, or the setting is 0.
    """
    timeout = statement_timeout_ms()
    if not timeout or getattr(request, _BOUNDED_ATTRIBUTE, False):
        yield
        return
    setattr(request, _BOUNDED_ATTRIBUTE, True)
    nested = connection.in_atomic_block
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT current_setting('statement_timeout'), "
                    "set_config('statement_timeout', %s, true)",
                    [f"{timeout}ms"],
                )
                previous = cursor.fetchone()[0]
            yield
            if nested:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT set_config('statement_timeout', %s, true)", [previous])
    finally:
        setattr(request, _BOUNDED_ATTRIBUTE, False)


def timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is PostgreSQL cancelling a statement for ``statement_timeout``."""
    return (
        isinstance(exc, OperationalError)
        and getattr(exc.__cause__, "sqlstate", None) == _QUERY_CANCELED
    )


def timed_out_response() -> HttpResponse:
    """What a list that hit the statement timeout answers: why, and what to do instead."""
    return HttpResponse(
        gettext(
            "This list took longer than %(ms)d ms to read and was stopped. Narrow it with a "
            "filter or fewer search words."
        )
        % {"ms": statement_timeout_ms()},
        status=503,
        content_type="text/plain; charset=utf-8",
    )


def bounded_search(request: HttpRequest, search: Callable[[], QuerySet[Any]]) -> QuerySet[Any]:
    """``search()``, which reads what it finds before it returns (admin/search.py,
    ``newest_matches``), under the request's statement timeout; one that hits the timeout is
    refused as 400 Bad Request (outside a changelist, which answers it itself)."""
    # Inside a changelist's bound, the changelist answers the timeout itself.
    outer = getattr(request, _BOUNDED_ATTRIBUTE, False)
    try:
        with bounded_statements(request):
            return search()
    except OperationalError as exc:
        if timed_out(exc) and not outer:
            raise BadRequest(timed_out_response().content.decode()) from None
        raise


class CleanQueryStrings:
    """Changelists answer a malformed query string with 400 Bad Request, never a 500, and read
    their rows under the statement timeout.

    No facets: Django's ``?_facets=1`` counts every row a list could show, once per choice of
    every filter (per tenant, per job name), outside the bounded paginator's reads; anyone who
    may see a list could loop that URL. The counts are the dashboard's, from its rollups.
    """

    show_facets = admin.ShowFacets.NEVER

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Answer a query string with NUL characters, over-long values or too many search words,
        or an action on a row id that is not one, with 400 Bad Request before Django runs it,
        instead of a 500 from the driver or a LIKE scan of every row; then build and render the
        list under ``bounded_statements``.
        """
        problem = bad_query_string(request.GET) or bad_search(request.GET.get(SEARCH_VAR, ""))
        if not problem and request.method == "POST":
            problem = bad_selection(self.model, request.POST)  # type: ignore[attr-defined]
        if problem:
            return HttpResponseBadRequest(problem, content_type="text/plain; charset=utf-8")
        try:
            with bounded_statements(request):
                response: HttpResponse = super().changelist_view(  # type: ignore[misc]
                    request, extra_context
                )
                # Rendered here, inside the bound: a list's template reads rows (filters'
                # choices, the page's cells) after the view has returned.
                if isinstance(response, SimpleTemplateResponse):
                    response.render()
        except OperationalError as exc:
            if not timed_out(exc):
                raise
            return timed_out_response()
        return response

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """Django's search, behind the same checks for every caller (the autocomplete too)."""
        checked_search(request, search_term)
        result: tuple[QuerySet[Any], bool] = super().get_search_results(  # type: ignore[misc]
            request, queryset, search_term
        )
        return result
