"""Pages of a history that may hold millions of rows, counted only as far as they are offered.

The run lists offer the newest ``MAX_PAGES`` pages; older runs are found by filter or search.
The "select all" action limit follows from the same figure (``selectable_rows``). Every
reader looks ``MAX_PAGES`` up in this module when it runs, so tests lower it here.
"""

from __future__ import annotations

from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

# The run lists offer this many pages at most: the newest runs; older ones are found by filter
# or search (a page 20,000 deep would mean skipping a million rows on every request).
MAX_PAGES = 200
# ... and count rows only this many pages beyond the one shown: a count reads every row it
# counts, and a filter no index fully answers (a busy tenant's search) makes that row by row.
LOOKAHEAD_PAGES = 5


class BoundedPaginator(Paginator):  # type: ignore[type-arg]  # Django's Paginator are not subscriptable at runtime
    """Pages of a list that may hold millions of rows, without counting them all.

    ``count`` stops at ``LOOKAHEAD_PAGES`` pages beyond the page asked for (``page_hint``), and
    never beyond ``MAX_PAGES`` (``COUNT`` over a ``LIMIT``ed subquery, which an index answers);
    ``capped`` says there are more. A page is read in
    two steps: the primary keys of its rows (the ``OFFSET`` is skipped in an index-only scan
    of the list's order), then those rows with their columns and annotations, so the rows
    skipped over are never read from the table.
    """

    def __init__(
        self,
        object_list: Any,
        per_page: int | str,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
        page_hint: int = 1,
    ) -> None:
        super().__init__(object_list, per_page, orphans, allow_empty_first_page)
        self.limit = counted_rows(page_hint, int(per_page))
        self.capped = False

    object_list: QuerySet[Any]

    @cached_property
    def count(self) -> int:
        """The number of rows, counted only up to the pages the list may show (``capped`` says when
        there are more), in the list's order so the planner reads the page's index.
        """
        # In the list's order, like the page itself: the planner then reads the same index the
        # page does and stops at the limit; unordered, it may pick a scan of the whole table
        # for a filter it cannot estimate (a busy tenant's search for a short value: 5 s).
        found = int(self.object_list.values("pk")[: self.limit + 1].count())
        self.capped = found > self.limit
        return min(found, self.limit)

    def page(self, number: Any) -> Page[Any]:
        """One page, read as the page's primary keys first and then their rows, so a deep page's
        offset is skipped on the index rather than over whole rows.
        """
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        keys = list(self.object_list.values_list("pk", flat=True)[bottom:top])
        rows = list(self.object_list.filter(pk__in=keys))
        page: Page[Any] = self._get_page(rows, number, self)  # type: ignore[attr-defined]
        return page


def counted_rows(page_hint: int, per_page: int) -> int:
    """How many rows the list counts for page ``page_hint`` (``LOOKAHEAD_PAGES`` beyond it, at
    most ``MAX_PAGES``); the paginator reads one more, to know whether there are more. A search
    narrows itself to as many (admin/search.py), so it is the one figure for both."""
    return min(MAX_PAGES, max(page_hint, 1) + LOOKAHEAD_PAGES) * per_page


def rows_read(page_hint: int, per_page: int, *, acting: bool) -> int:
    """The most rows of a list, in its order, that a request for page ``page_hint`` reads: the
    paginator's count and one more, and when ``acting`` (an action's POST) the "select all"
    limit and one more too (``too_many_selected``)."""
    read = counted_rows(page_hint, per_page) + 1
    return max(read, selectable_rows() + 1) if acting else read


def selectable_rows() -> int:
    """The most rows "select all" may act on: as many as the list's pages show (50 a page)."""
    return MAX_PAGES * 50


def too_many_selected(queryset: QuerySet[Any]) -> bool:
    """Whether "select all" would act on more rows than the list can show."""
    return bool(
        queryset.order_by().values("pk")[: selectable_rows() + 1].count() > selectable_rows()
    )
