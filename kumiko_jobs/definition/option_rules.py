"""``@job``'s options that are checked together: when a run starts (cron, events, fan-out, boot),
how many may wait or run (``concurrency=``, ``max_per_tenant=``, ``tenant_concurrency=``) and
``unique=``. Each function checks one group, in the order ``options.build_definition`` reports
mistakes; the single values are ``option_values.py``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from . import option_values as parse
from .cron import check_cron, check_timezone
from .job import CONCURRENCY_MODES


def trigger_options(where: str, options: Mapping[str, Any], system: bool) -> dict[str, Any]:
    """cron, events, fan-out, concurrency and boot options, checked together: the definition's
    fields they fill in."""
    out: dict[str, Any] = {}
    _schedule(where, options, system, out)
    _events(where, options, out)
    _concurrency(where, options, out)
    _boot_and_schedule_rules(where, system, out)
    return out


def _schedule(where: str, options: Mapping[str, Any], system: bool, out: dict[str, Any]) -> None:
    """The flags that say who a run is for, and ``cron=`` with its ``timezone=``."""
    for flag in ("per_tenant", "run_on_boot", "boot_gate"):
        value = options.get(flag, False)
        if not isinstance(value, bool):
            raise parse.fail(where, f"{flag} must be True or False, got {value!r}.")
        out[flag] = value
    if system and out["per_tenant"]:
        raise parse.fail(where, "a job is either system=True (public schema) or per_tenant=True.")
    cron = options.get("cron")
    if cron is not None:
        out["cron"] = check_cron(where, cron, per_tenant=out["per_tenant"])
        out["timezone"] = check_timezone(where, options.get("timezone", "UTC"))
        if not (system or out["per_tenant"]):
            raise parse.fail(
                where,
                f"cron={cron!r} runs for no tenant: declare system=True (one run "
                "in the public schema) or per_tenant=True (one run per tenant).",
            )
    elif "timezone" in options:
        raise parse.fail(where, "timezone= only applies to cron jobs.")


def _events(where: str, options: Mapping[str, Any], out: dict[str, Any]) -> None:
    """``on=`` (one event name or several) and its payload filter ``where=``."""
    on = options.get("on", ())
    events = (on,) if isinstance(on, str) else on
    if not isinstance(events, Sequence) or not all(isinstance(e, str) and e for e in events):
        raise parse.fail(where, f"on= must be an event name or a list of names, got {on!r}.")
    out["on"] = tuple(events)
    where_filter = options.get("where", {})
    if not isinstance(where_filter, Mapping) or (where_filter and not events):
        raise parse.fail(where, "where= is an equality filter on event payloads: a dict, with on=.")
    out["where"] = dict(where_filter)


def _concurrency(where: str, options: Mapping[str, Any], out: dict[str, Any]) -> None:
    """``concurrency=`` (with ``debounce=``), ``max_per_tenant=`` and ``tenant_concurrency=``."""
    mode = options.get("concurrency", "parallel")
    if mode not in CONCURRENCY_MODES:
        raise parse.fail(where, f"concurrency={mode!r}; use one of {CONCURRENCY_MODES}.")
    out["concurrency"] = mode
    debounce = options.get("debounce")
    if mode == "debounce":
        if isinstance(debounce, bool) or not isinstance(debounce, int | float) or debounce <= 0:
            raise parse.fail(where, "concurrency='debounce' needs debounce=<seconds > 0>.")
        out["debounce"] = float(debounce)
    elif debounce is not None:
        raise parse.fail(where, "debounce= needs concurrency='debounce'.")
    out["max_per_tenant"] = parse.int_option(
        where, "max_per_tenant", options.get("max_per_tenant"), 1
    )
    out["tenant_concurrency"] = parse.int_option(
        where, "tenant_concurrency", options.get("tenant_concurrency"), 1
    )


def _boot_and_schedule_rules(where: str, system: bool, out: Mapping[str, Any]) -> None:
    """Boot gates and boot jobs need no tenant and no queue; a schedule has no bursts."""
    mode = out["concurrency"]
    if out["boot_gate"] and not system:
        raise parse.fail(
            where, "boot_gate=True runs once at worker start, for no tenant: declare system=True."
        )
    if out["run_on_boot"] and not (system or out["per_tenant"]):
        raise parse.fail(
            where,
            "run_on_boot=True enqueues without a tenant: declare system=True or per_tenant=True.",
        )
    limited = mode != "parallel" or out["max_per_tenant"] or out["tenant_concurrency"]
    if out["boot_gate"] and (out["per_tenant"] or limited or out["run_on_boot"]):
        # A boot gate is not enqueued: every worker runs it inline before its first message,
        # so there is no queue for a concurrency option to act on.
        raise parse.fail(
            where,
            "boot_gate=True runs inline at worker start; it cannot be combined "
            "with per_tenant, run_on_boot, concurrency=, max_per_tenant or tenant_concurrency.",
        )
    if "cron" in out and mode == "debounce":
        # Debounce waits for a quiet period after a burst of enqueues; a schedule has no
        # bursts, and every tick would only be delayed and then replace its predecessor.
        raise parse.fail(
            where,
            "concurrency='debounce' coalesces bursts of enqueues; a cron schedule has none. "
            "Use 'skip' (drop a tick while the last one is active) or 'sequential'.",
        )


def unique_options(
    where: str, options: Mapping[str, Any], params: Sequence[str], triggers: Mapping[str, Any]
) -> tuple[tuple[str, ...] | None, float]:
    """``unique=`` and ``unique_for=`` (enqueueing/unique.py), checked against the job's
    arguments and the concurrency modes that would contradict them."""
    value, window = options.get("unique"), options.get("unique_for")
    if value is None or value is False:
        if window is not None:
            raise parse.fail(
                where, "unique_for= needs unique= (the arguments that make a run unique)."
            )
        return None, 0.0
    if value is True:
        names: tuple[str, ...] = tuple(params)
    else:
        names = parse.argument_names(where, "unique", value, params)
        if not names:
            raise parse.fail(
                where,
                "unique=[] names no argument; use unique=True (all arguments) or "
                "concurrency='skip' (one active run of the job per tenant, whatever its "
                "arguments).",
            )
    mode = triggers.get("concurrency", "parallel")
    if mode in ("replace", "debounce"):
        raise parse.fail(
            where,
            f"unique= returns the waiting run of the same arguments; concurrency={mode!r} "
            "cancels it for the newer enqueue. Choose one of the two.",
        )
    if triggers.get("boot_gate"):
        raise parse.fail(where, "boot_gate=True runs inline at worker start: unique= has no runs.")
    seconds = 0.0
    if window is not None:
        raw = window.total_seconds() if isinstance(window, timedelta) else window
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not raw > 0:
            raise parse.fail(
                where, f"unique_for must be seconds > 0 or a timedelta, got {window!r}."
            )
        seconds = float(raw)
    return names, seconds
