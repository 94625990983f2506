"""What a project's tenant settings say for one tenant: ``TENANT_WEIGHT`` and
``TENANT_RATE_LIMIT`` (a fixed rate, or a callable the setting names), resolved at every push
so that a plan change applies to the next message (``messages.message_for``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .. import transport
from ..core import conf
from ..core.rates import Rate, parse_rate

_rate_callables: dict[str, Callable[[str], Any]] = {}


def tenant_rate_of(schema: str) -> Rate | None:
    """A tenant's ``TENANT_RATE_LIMIT``: the fixed rate, or what the configured callable says
    for ``schema`` ("100/m", a ``Rate``, or None for no limit), resolved at every push as
    ``TENANT_WEIGHT`` is, so a plan change applies to the next message."""
    setting = conf.get().TENANT_RATE_LIMIT
    if not isinstance(setting, str):
        return setting
    func = _rate_callables.get(setting)
    if func is None:
        func = _rate_callables[setting] = import_rate_callable(setting)
    value = call_tenant_setting("TENANT_RATE_LIMIT", setting, func, schema)
    if value is None:
        return None
    try:
        return parse_rate(value)
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"settings.KUMIKO_JOBS['TENANT_RATE_LIMIT'] ({setting}) returned {value!r} for tenant "
            f"{schema!r}: {exc}; or None for no limit."
        ) from exc


def import_rate_callable(path: str) -> Callable[[str], Any]:
    """The callable ``TENANT_RATE_LIMIT`` names; ImproperlyConfigured naming the fix (the
    system check ``kumiko_jobs.E017`` says the same at start-up)."""
    try:
        func = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"settings.KUMIKO_JOBS['TENANT_RATE_LIMIT'] = {path!r} cannot be imported ({exc}); "
            "name a callable that takes a schema name and returns a rate such as '100/m' or "
            "None, or give a fixed rate."
        ) from exc
    if not callable(func):
        raise ImproperlyConfigured(
            f"settings.KUMIKO_JOBS['TENANT_RATE_LIMIT'] = {path!r} is not callable; name a "
            "function that takes a schema name and returns a rate such as '100/m' or None."
        )
    return func  # type: ignore[no-any-return]


_weight_callables: dict[str, Callable[[str], Any]] = {}


def weight_of(schema: str | None) -> float:
    """A tenant's weight in the fair dequeue, from ``TENANT_WEIGHT`` (resolved at every push,
    so a plan change applies to the next message; system runs weigh 1)."""
    path = conf.get().TENANT_WEIGHT
    if path is None or schema is None:
        return 1.0
    func = _weight_callables.get(path)
    if func is None:
        try:
            func = import_string(path)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"settings.KUMIKO_JOBS['TENANT_WEIGHT'] = {path!r} cannot be imported ({exc}); "
                "name a callable that takes a schema name and returns a number > 0."
            ) from exc
        _weight_callables[path] = func
    value = call_tenant_setting("TENANT_WEIGHT", path, func, schema)
    weight = transport.valid_weight(value)
    if weight is None:
        raise ImproperlyConfigured(
            f"settings.KUMIKO_JOBS['TENANT_WEIGHT'] ({path}) returned {value!r} for tenant "
            f"{schema!r}; it must return a finite number from {transport.WEIGHT_MIN:g} to "
            f"{transport.WEIGHT_MAX:g} (1 is the default share)."
        )
    return weight


def call_tenant_setting(name: str, path: str, func: Callable[[str], Any], schema: str) -> Any:
    """What the project's callable for setting ``name`` says for ``schema``; whatever it
    raises becomes ImproperlyConfigured naming the setting and the tenant, the one error the
    pushes made for other tenants than the caller's (the relay, a fan-out, the sweep) catch
    to leave this tenant's run waiting rather than stop everyone's (``pushable``)."""
    try:
        return func(schema)
    except Exception as exc:
        raise ImproperlyConfigured(
            f"settings.KUMIKO_JOBS[{name!r}] ({path}) raised {type(exc).__name__}: {exc} for "
            f"tenant {schema!r}."
        ) from exc
