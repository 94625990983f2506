"""JobDefinition.bind_arguments' name check (definition/job.py ``_fits``) agrees with
``inspect.Signature.bind`` on every shape of job function: it only ever skips a bind that
would succeed."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from kumiko_jobs.definition.job import _fits


def kw_only(ctx, *, a, b=1): ...
def mixed(ctx, a, b=2, *, c): ...
def extra(ctx, *, a, **more): ...
def positional_only(ctx, a, /, *, b=1): ...
def ctx_positional_only(ctx, /, *, a, **more): ...
def star_args(ctx, *args, a=1): ...
def keyword_ctx(*, ctx, a=1): ...
def nothing(): ...


FUNCS = [
    kw_only,
    mixed,
    extra,
    positional_only,
    ctx_positional_only,
    star_args,
    keyword_ctx,
    nothing,
]
KWARGS: list[dict[str, Any]] = [
    {},
    {"a": 1},
    {"a": 1, "b": 2},
    {"a": 1, "c": 3},
    {"a": 1, "b": 2, "c": 3},
    {"a": 1, "zzz": 0},
    {"a": 1, "ctx": 0},
    {"b": 2},
    {"args": 1},
]


@pytest.mark.parametrize("func", FUNCS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("kwargs", KWARGS, ids=lambda k: ",".join(k) or "none")
def test_a_skipped_bind_is_one_that_succeeds(func, kwargs):
    try:
        inspect.signature(func).bind(None, **kwargs)
        binds = True
    except TypeError:
        binds = False
    if _fits(func, kwargs):
        assert binds
    # The usual shape is decided without bind both ways.
    if func in (kw_only, mixed, extra) and binds:
        assert _fits(func, kwargs)
