"""The run list's search, written so that an index answers each word.

Django's own search puts every field under ``UPPER(...) LIKE``, which no index answers for a
job name or a correlation id, and asks the subject's trigram index for whole ``field=value``
words that are in millions of rows. A tenant searches subjects only; an operator also job
names, correlation ids and run ids (docs/observability.md, "History at scale").

A search reads the first rows, in the list's order, of one branch per index and merges them
(``newest_matches``): the list never reads more rows than its pages count, so no branch needs
more than those. The admin narrows every search this way, wherever it is called (the change
list, an action's POST, the autocomplete), and no search has more than ``MAX_SEARCH_WORDS``
words (``checked_words``): a request costs a page's worth of rows, each tested against a few
words.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from functools import reduce
from operator import and_, or_

from django.core.exceptions import BadRequest
from django.db.models import Q, QuerySet
from django.db.models.functions import Lower

from ..models import JobRun
from .filters import run_job_names
from .query_strings import bad_search, search_words


def checked_words(search_term: str) -> list[str]:
    """The words of a search, or ``BadRequest`` (400) when it has more than
    ``MAX_SEARCH_WORDS`` or a word over ``MAX_SEARCH_WORD_CHARS`` (admin/query_strings.py):
    each word is a condition on every row a branch reads, so their number bounds a request's
    work as much as the rows do. Here, so that no caller of the search can skip it."""
    problem = bad_search(search_term)
    if problem:
        raise BadRequest(problem)
    return search_words(search_term)


def subject_contains(word: str) -> Q:
    """Subjects containing ``word`` (any case), written so that the trigram index is asked
    only for the selective part of it. Needs ``kj_subject_lower`` (``Lower("subject")``).

    Subjects are ``field=value`` pairs; the field names are in every run of a job, so their
    trigrams are in millions of rows, and a trigram search for ``invoice_id=445196`` reads
    all of those posting lists (1.2 s at 10 million runs) where ``445196`` alone takes 20 ms.
    So for a word with ``=``, the index is asked for the value after the last ``=`` (when it
    has three characters or more: a trigram's length) and the whole word is checked on the
    rows it returns through ``LOWER(subject)``, which the index does not cover, so the planner
    keeps it as a filter. A shorter value is no use to the index; the field name (three
    characters or more) then is: for a field the runs have it is in millions of rows, and the
    planner, seeing that, reads the list in its own order and filters (short values match
    many rows); for a field no run has, the index returns nothing at once, where the list's
    order alone would read the whole table to find no match (3 s at 10 million runs, 0.6 ms
    now). Other words: the index on the whole word.
    """
    whole = Q(kj_subject_lower__contains=word.lower())
    if "=" not in word:
        return Q(subject__icontains=word)
    field, value = word.rsplit("=", 1)
    if len(value) >= 3:
        return Q(subject__icontains=value) & whole
    if len(field) >= 3:
        return Q(subject__icontains=field) & whole
    return whole


# One branch per job name up to this many names matching a word; beyond, one branch for them
# all (a word in that many names matches many runs, which the time index finds densely).
MAX_NAME_BRANCHES = 20


def newest_matches(
    queryset: QuerySet[JobRun], branches: Sequence[Q], ordering: Sequence[str], rows: int
) -> QuerySet[JobRun]:
    """The runs of ``queryset`` that match any of ``branches``, narrowed to the first ``rows`` of
    them in ``ordering`` (the list's order): their primary keys are read here, in one query.

    Why: with an OR of conditions that different indexes answer, the planner has one plan for
    the whole, and each is wrong for some search: walk the time index testing every row (0.65 s
    at 10 million runs to find a job that has 0.25 % of them) or read every match and sort
    (slow when they are many). Here each branch is its own ``ORDER BY ... LIMIT rows``, which
    the planner reads from the branch's index for the first rows only, and the branches are
    merged (UNION ALL, a Merge Append) and cut at ``rows`` again. The list reads no more than
    ``rows`` (the paginator's count and the "select all" limit, admin/pagination.py), so it
    shows the same runs in the same order as the plain OR would. The branches are made
    disjoint (each excludes the ones before it) so the limit counts distinct runs.

    The keys are read once, here, and the list then asks for those keys only: the paginator's
    count, its page of keys and the page's rows would otherwise each run the search again (a
    busy tenant's search walks its time index past thousands of rows for 300 matches: 0.1 s
    each time at 10 million runs).
    """
    # The pk and the ordering's fields: a compound query orders by the columns it selects.
    fields = ["pk", *(f.removeprefix("-") for f in ordering if f.removeprefix("-") != "pk")]
    parts = []
    before: Q | None = None
    for branch in branches:
        own = branch if before is None else branch & ~before
        before = branch if before is None else before | branch
        parts.append(queryset.filter(own).order_by(*ordering).values_list(*fields)[:rows])
    # A branch the filters already rule out (an empty IN) is left out: Django's union drops
    # it and hands back a lone sliced branch, which cannot be ordered again.
    parts = [part for part in parts if not part.query.is_empty()]
    if not parts:
        return queryset.none()
    first, *others = parts
    merged = first.union(*others, all=True).order_by(*ordering)[:rows] if others else first
    keys = [row[0] for row in merged]
    return queryset.filter(pk__in=keys)


def tenant_search(
    queryset: QuerySet[JobRun],
    search_term: str,
    ordering: Sequence[str] | None = None,
    rows: int = 0,
) -> QuerySet[JobRun]:
    """A tenant's search: subjects only (its ``tenant_search_fields``), each word as
    ``subject_contains`` reads it; narrowed to the first ``rows`` runs in ``ordering`` when
    given (``newest_matches``)."""
    queryset = queryset.alias(kj_subject_lower=Lower("subject"))
    words = checked_words(search_term)
    if not words:
        return queryset
    condition = reduce(and_, (subject_contains(word) for word in words))
    if ordering is None:
        return queryset.filter(condition)
    return newest_matches(queryset, [condition], ordering, rows)


def operator_search(
    queryset: QuerySet[JobRun],
    search_term: str,
    ordering: Sequence[str] | None = None,
    rows: int = 0,
) -> QuerySet[JobRun]:
    """An operator's search: a run id, or words that each match a subject, a job name or a
    correlation id; narrowed to the first ``rows`` runs in ``ordering`` when given
    (``newest_matches``: one branch per index the first word's match can be read from)."""
    # Run ids are pasted from logs with or without dashes: match them exactly (the
    # primary key index) rather than as text; a generated correlation id has the same
    # shape (32 hex digits), so it is looked up too (its own index).
    words = checked_words(search_term)
    term = search_term.strip()
    try:
        run_id = uuid.UUID(term)
    except ValueError:
        pass
    else:
        return queryset.filter(Q(pk=run_id) | Q(correlation_id=term))
    # Each word must match the subject (substring: the trigram index), the job name
    # (substring of one of the few names, then an index lookup of those) or the
    # correlation id (exactly: its index). Django's own search would put the job name and
    # the correlation id under UPPER(...) LIKE, which no index answers.
    queryset = queryset.alias(kj_subject_lower=Lower("subject"))
    if not words:
        return queryset
    names = run_job_names()
    branches = [word_branches(word, names) for word in words]
    if ordering is None:
        for word_branch in branches:
            queryset = queryset.filter(reduce(or_, word_branch))
        return queryset
    # The first word is read branch by branch; every other word is a condition on each branch.
    for word_branch in branches[1:]:
        queryset = queryset.filter(reduce(or_, word_branch))
    return newest_matches(queryset, branches[0], ordering, rows)


def word_branches(word: str, names: Sequence[str]) -> list[Q]:
    """What an operator's search word matches, one condition per index that answers it: each
    job name containing the word (the job's time index), the subject (``subject_contains``) and
    the correlation id (exactly)."""
    matching = [n for n in names if word.casefold() in n.casefold()]
    if len(matching) > MAX_NAME_BRANCHES:
        jobs = [Q(job_name__in=matching)]
    else:
        jobs = [Q(job_name=name) for name in matching]
    return [*jobs, subject_contains(word), Q(correlation_id=word)]
