"""Everything that can be wrong with an enqueue, found in the caller's code.

Unknown arguments, values JSON cannot carry, a missing or wrong tenant, a message that would
outgrow ``MAX_ENVELOPE_BYTES`` at its last attempt: each raises ``InvalidJob`` here, where the
caller can see and fix it, never later in a worker. ``submit`` and follow-ups both call these.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import connection
from django_tenants.utils import get_tenant_model

from .. import transport
from ..core import conf, project_settings
from ..core.envelope import WIDEST_SIGNING_TIME, Envelope, encode
from ..core.exceptions import InvalidJob
from ..core.text import text_problem
from ..definition.job import JobDefinition
from ..definition.subject import build_subject

# Python's int <-> str conversion refuses more digits than this by default (the worker's
# json.loads among them): a bigger integer would be accepted here and fail every attempt.
MAX_INTEGER_DIGITS = 4300


def too_many_digits(value: int) -> bool:
    """Whether ``value`` has more than ``MAX_INTEGER_DIGITS`` decimal digits, told from its bit
    length, without the conversion that would raise."""
    # 3.33 bits a digit: a bound a little under the true count, so nothing JSON can carry is
    # refused; the few values just above it are checked exactly (str() of ~4,300 digits).
    if value.bit_length() < 3.32 * MAX_INTEGER_DIGITS:
        return False
    try:
        return len(str(abs(value))) > MAX_INTEGER_DIGITS
    except ValueError:  # over the interpreter's own limit
        return True


def check_json(kwargs: Mapping[str, Any], job_name: str) -> None:
    """Arguments travel as JSON: refuse anything that would not come back equal.

    Nesting is bounded (``MAX_ARGUMENT_DEPTH``): deeper arguments would hit Python's recursion
    limit here, in ``json.dumps`` or in the worker's ``json.loads``, as a RecursionError (a
    500 in a view) instead of a clear refusal; a list that contains itself is caught the same
    way.
    """
    walk = _JsonWalk(job_name, conf.get().MAX_ARGUMENT_DEPTH)
    for name, value in kwargs.items():
        problem = text_problem(name) if isinstance(name, str) else ""
        if problem:
            raise InvalidJob(f"Job {job_name!r}: the name of argument {name!r} {problem}.")
        walk.value(value, repr(name))


@dataclasses.dataclass(frozen=True)
class _JsonWalk:
    """One argument's values, depth first; ``path`` names the value in a refusal."""

    job_name: str
    max_depth: int

    def value(self, value: Any, path: str, depth: int = 0) -> None:
        # depth: the lists and dicts around ``value``; ``value`` itself may add one more.
        if depth >= self.max_depth and isinstance(value, list | dict):
            raise InvalidJob(
                f"Job {self.job_name!r}: argument {path[:200]} is nested more than "
                f"MAX_ARGUMENT_DEPTH={self.max_depth} levels deep. Flatten it, or pass an id and "
                "load the data in the job."
            )
        if isinstance(value, list):
            for i, item in enumerate(value):
                self.value(item, f"{path}[{i}]", depth + 1)
        elif isinstance(value, dict):
            for key, item in value.items():
                self.key(key, path)
                self.value(item, f"{path}[{key!r}]", depth + 1)
        else:
            self.scalar(value, path)

    def key(self, key: Any, path: str) -> None:
        if not isinstance(key, str):
            raise InvalidJob(
                f"Job {self.job_name!r}: argument {path} has a non-string key {key!r}."
            )
        problem = text_problem(key)
        if problem:
            raise InvalidJob(f"Job {self.job_name!r}: a key of argument {path} {problem}.")

    def scalar(self, value: Any, path: str) -> None:
        job_name = self.job_name
        if isinstance(value, str):
            problem = text_problem(value)
            if problem:
                raise InvalidJob(f"Job {job_name!r}: argument {path} {problem}.")
            return
        if isinstance(value, int) and not isinstance(value, bool) and too_many_digits(value):
            raise InvalidJob(
                f"Job {job_name!r}: argument {path} is an integer of more than "
                f"{MAX_INTEGER_DIGITS} digits, which JSON readers refuse. Pass it as a string."
            )
        if value is None or isinstance(value, bool | int):
            return
        if isinstance(value, float):
            if not math.isfinite(value):
                raise InvalidJob(
                    f"Job {job_name!r}: argument {path} is {value}, which JSON cannot carry."
                )
            return
        hint = ""
        if hasattr(value, "_meta") and hasattr(value, "pk"):
            hint = " Pass its primary key and load it in the job."
        elif isinstance(value, tuple):
            hint = " Pass a list."
        elif isinstance(value, datetime):
            hint = " Pass value.isoformat()."
        raise InvalidJob(
            f"Job {job_name!r}: argument {path} is a {type(value).__name__}, which is not JSON."
            + hint
        )


def resolve_schema(definition: JobDefinition, tenant: Any) -> str | None:
    """The schema a new run runs in: ``tenant=`` (a tenant or a schema name that exists), else
    the current tenant; None for a system job or a fan-out parent. Refuses the public schema."""
    public = project_settings.public_schema_name()
    if definition.per_tenant and tenant is None:
        current = getattr(connection, "schema_name", public)
        # Only the public schema fans out (one child run per tenant, made by the worker). From
        # a tenant's request it is that tenant's run, as emit() and ctx.enqueue() make it: a
        # tenant's input never reaches every other tenant's schema by a missing tenant=.
        return None if current == public else str(current)
    if definition.system:
        if tenant is not None:
            raise InvalidJob(f"Job {definition.name!r} is a system job; it takes no tenant=.")
        return None
    if tenant is None:
        schema = getattr(connection, "schema_name", public)
        if schema == public:
            raise InvalidJob(
                f"Job {definition.name!r} was enqueued from the public schema without tenant=. "
                "Pass tenant=<Tenant or schema name>, or enqueue inside the tenant's request."
            )
        return str(schema)
    schema = tenant if isinstance(tenant, str) else getattr(tenant, "schema_name", None)
    if not isinstance(schema, str) or not schema:
        raise InvalidJob(f"tenant= must be a tenant or a schema name, got {tenant!r}.")
    problem = text_problem(schema)
    if problem:
        raise InvalidJob(f"tenant= {schema!r} {problem}; give a tenant's schema name.")
    if schema == public:
        raise InvalidJob(f"Job {definition.name!r} cannot run for the public schema.")
    if (
        isinstance(tenant, str)
        and not get_tenant_model().objects.filter(schema_name=schema).exists()
    ):
        raise InvalidJob(f"No tenant has the schema {schema!r}.")
    return schema


def validated(definition: JobDefinition, kwargs: dict[str, Any]) -> str:
    """Check ``kwargs`` against the job's signature and JSON; the run's subject."""
    definition.bind_arguments(kwargs)
    check_json(kwargs, definition.name)
    return build_subject(definition, kwargs)


# Gate deferrals (an inactive tenant's runs waiting, say) have no cap; the size check reserves
# the digits of this many, which at one deferral a second is over thirty years.
GATE_DEFERS_HEADROOM = 999_999_999

# The longest schema name PostgreSQL allows: what a fan-out child's envelope may carry.
_LONGEST_SCHEMA = "s" * 63


def largest_reachable(definition: JobDefinition, env: Envelope) -> Envelope:
    """``env`` as it will look at its biggest: the last attempt, every deferral used, and,
    for a fan-out parent, as a child run (a schema, a parent id and a trigger added).

    Retries and deferrals are the same envelope with bigger counters; a message that fits
    only at attempt 1 would be refused by every worker from some later attempt on, and the
    relay would push it again and again.
    """
    largest = dataclasses.replace(
        env,
        attempt=max(env.attempt, definition.max_attempts),
        defers=max(env.defers, definition.effective_max_defers),
        gate_defers=max(env.gate_defers, GATE_DEFERS_HEADROOM),
    )
    if definition.per_tenant and env.schema is None:
        largest = dataclasses.replace(
            largest,
            schema=_LONGEST_SCHEMA,
            parent_run_id=env.run_id,
            trigger=env.trigger or "fanout",
        )
    return largest


def _growth_bound(definition: JobDefinition) -> int:
    """More than the bytes ``largest_reachable`` can add: the counters' digits, and for a
    fan-out child its schema (63), parent id (32) and trigger, with quotes."""
    return (
        128
        + len(str(GATE_DEFERS_HEADROOM))
        + len(str(definition.max_attempts))
        + len(str(definition.effective_max_defers))
    )


def check_size(definition: JobDefinition, env: Envelope, message: transport.Message) -> None:
    """Refuse a message that is, or would grow (``largest_reachable``), over
    ``MAX_ENVELOPE_BYTES``: every worker would refuse it from that attempt on."""
    limit = conf.get().MAX_ENVELOPE_BYTES
    size = len(message.body)  # signed ASCII JSON: one byte per character
    if limit < size + _growth_bound(definition):
        # Close to or past the limit: measure the largest envelope exactly (a second encode),
        # signed at the widest time, as a relayed or deferred copy may be re-signed any time.
        size = len(encode(largest_reachable(definition, env), now=WIDEST_SIGNING_TIME))
    if size > limit:
        raise InvalidJob(
            f"Job {definition.name!r}: arguments make a message of up to {size} bytes (at its "
            f"last attempt and deferral), over MAX_ENVELOPE_BYTES={limit}. Pass ids and load "
            "the data in the job."
        )
