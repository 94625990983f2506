"""The rows of a bulk enqueue, written with PostgreSQL's ``COPY`` instead of an ``INSERT``.

At 10,000 runs a call, building a ``JobRun`` per item and Django's multi-row ``INSERT`` (every
value of every field prepared and bound one by one) cost more than everything else of
``enqueue_many``. The runs of one call share most of their row (job, tenant, queue, actor,
correlation, trace, origin): the first item's row is made by ``messages.row_for`` like any
run's, its values prepared for the database once, and each further item's row is that one
with the fields that differ per item (``_PER_ITEM``, computed by the functions ``row_for``
calls). tests/integration/test_enqueue_many_rows.py compares the rows written this way with
``row_for``'s field by field, so a field added to ``row_for`` that varies per item fails there.

``COPY`` cannot skip a conflicting row, so only jobs without ``unique=`` come here: their run
ids are new UUIDs and nothing else of the row is unique. Unique jobs keep the ``INSERT ... ON
CONFLICT DO NOTHING`` (``fanout.insert_new``), which tells which keys were taken.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from django.db import connection
from psycopg.types.json import Jsonb

from ..core.envelope import Envelope
from ..definition.job import JobDefinition
from ..models import JobRun
from .messages import row_for

# The columns whose value differs between two runs of one bulk enqueue.
# (A correlation id is new per enqueue outside a request, hence per item.)
_PER_ITEM = (
    "run_id",
    "rq_job_id",
    "correlation_id",
    "subject",
    "payload",
    "priority",
    "queued_at",
)

# Rows per COPY statement (one ``COPY`` streams them; this bounds one statement's size).
COPY_CHUNK = 5000


class BatchRows:
    """The COPY rows of one ``enqueue_many`` call of a job without ``unique=``."""

    def __init__(self, definition: JobDefinition, first: Envelope, subject: str) -> None:
        assert definition.unique is None, "unique jobs need ON CONFLICT: fanout.insert_new"
        self.definition = definition
        self.fields = [f for f in JobRun._meta.concrete_fields if not f.generated]
        row = row_for(definition, first, subject, 0.0)
        self.template = [
            _encoded_once(f.get_db_prep_save(getattr(row, f.attname), connection))
            for f in self.fields
        ]
        where = {f.attname: i for i, f in enumerate(self.fields)}
        (
            self._run_id,
            self._rq_job_id,
            self._correlation_id,
            self._subject,
            self._payload,
            self._priority,
            self._queued_at,
        ) = (where[name] for name in _PER_ITEM)
        # The arguments as the JSON text the field would have psycopg write (its encoder's),
        # without Django's preparation of a value per row.
        prepared = JobRun._meta.get_field("payload").get_db_prep_save({}, connection)
        self._payload_json = (prepared.dumps if isinstance(prepared, Jsonb) else None) or json.dumps
        self._now = row.queued_at
        self._made = 0

    def row(self, env: Envelope, subject: str, priority: int) -> tuple[uuid.UUID, list[Any]]:
        """The run id and the COPY row of ``env`` (validated, its subject ``subject``, its
        message's priority level ``priority``: ``priority_of``'s, as for any run), the next
        of the call's rows."""
        values = list(self.template)
        run_id = uuid.UUID(env.run_id)
        values[self._run_id] = run_id
        values[self._rq_job_id] = env.rq_job_id
        values[self._correlation_id] = env.correlation_id
        values[self._subject] = subject
        values[self._payload] = self._payload_json(env.kwargs)
        values[self._priority] = priority
        # A microsecond apart, in the items' order: whoever orders by queued_at (the relay,
        # the admin) sees the batch in the order it was given.
        values[self._queued_at] = self._now + timedelta(microseconds=self._made)
        self._made += 1
        return run_id, values

    def copy(self, rows: Iterable[Sequence[Any]]) -> None:
        """Write ``rows`` with ``COPY`` in the current transaction, ``COPY_CHUNK`` a statement,
        each row sent as ``rows`` yields it (PostgreSQL inserts them meanwhile). An exception
        from ``rows`` aborts the statement under way and propagates."""
        table = connection.ops.quote_name(JobRun._meta.db_table)
        columns = ", ".join(connection.ops.quote_name(str(f.column)) for f in self.fields)
        sql = f"COPY {table} ({columns}) FROM STDIN"
        rest = iter(rows)
        with connection.cursor() as cursor:
            while (head := next(rest, None)) is not None:
                chunk = itertools.chain([head], itertools.islice(rest, COPY_CHUNK - 1))
                # Through Django's execute wrappers (the DB guard, query counters) like any
                # statement; the executor streams the rows on the psycopg cursor.
                cursor._execute_with_wrappers(sql, None, False, executor=_copy_executor(chunk))


def _encoded_once(value: Any) -> Any:
    """A JSON value shared by every row (the trace context, the origin) as its text: psycopg
    would encode the same ``Jsonb`` again for each row it copies; PostgreSQL reads the text
    into the ``jsonb`` column as it reads the encoded value."""
    if isinstance(value, Jsonb):
        dumps = value.dumps or json.dumps
        return dumps(value.obj)
    return value


def _copy_executor(rows: Iterable[Sequence[Any]]) -> Any:
    def execute(sql: str, params: Any, many: bool, context: dict[str, Any]) -> None:
        with context["connection"].wrap_database_errors, context["cursor"].cursor.copy(sql) as copy:
            for row in rows:
                copy.write_row(row)

    return execute
