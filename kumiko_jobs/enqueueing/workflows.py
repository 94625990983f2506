"""Workflows: steps built from job calls, enqueued as one unit, on commit, in one tenant.

``a.step(x=1)`` is a step (a job call not yet made); ``chain(...)``, ``group([...], then=...)``
and ``after=[...]`` say which steps wait for which; ``workflow(flow, name=...).enqueue()``
writes the workflow, its steps and the runs of the steps that wait for nothing in the caller's
transaction, in chunks, and pushes those runs' messages once it commits (read back from their
rows chunk by chunk, so a group of 10,000 members never holds 10,000 messages). Each step is
an ordinary run of the workflow's tenant; the others are released as their predecessors
finish (``workflow_release``). docs/workflows.md states the rules.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import logging
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from .. import origin
from ..core import conf
from ..core.exceptions import InvalidJob
from ..core.text import text_problem
from ..definition.job import JobDefinition
from ..history import workflows as history
from ..models import JobRun, RunStatus, StepState, Workflow, WorkflowStep
from . import followups, waiting
from .messages import message_for, new_envelope, row_for
from .validate import check_size, resolve_schema, validated
from .workflow_release import CHUNK, OUTCOMES_ARGUMENT, RESULTS_ARGUMENT, cancel, push_released

logger = logging.getLogger("kumiko_jobs.workflows")


_INJECTED = (RESULTS_ARGUMENT, OUTCOMES_ARGUMENT)
_REFUSED_CONCURRENCY = ("skip", "replace", "debounce")


class Step:
    """One job call of a workflow; ``after``: the steps it waits for (of the same workflow)."""

    __slots__ = ("after", "always", "definition", "enqueued", "key", "kwargs")

    def __init__(
        self,
        definition: JobDefinition,
        kwargs: dict[str, Any],
        *,
        key: str | None = None,
        after: Iterable[Step] = (),
    ) -> None:
        declared = inspect.signature(definition.func).parameters
        if "after" in declared or "key" in declared:
            raise InvalidJob(
                f"{definition.name}.step(): the job has a parameter named 'after' or 'key', the "
                "step's own keywords; rename it, or enqueue the job with kumiko_jobs.enqueue."
            )
        for name in _INJECTED:
            if name in kwargs:
                raise InvalidJob(
                    f"{definition.name}.step(): {name} is filled in by the workflow from the "
                    "steps this one waits for; do not pass it."
                )
        self.definition = definition
        self.kwargs = kwargs
        self.key = key
        self.after: list[Step] = []
        self.always = False
        self.enqueued = False
        for other in after:
            if not isinstance(other, Step):
                raise InvalidJob(f"after= takes steps (job.step(...)), got {other!r}.")
            self.after.append(other)

    def __repr__(self) -> str:
        return f"<Step {self.key or self.definition.name}>"


@dataclasses.dataclass(slots=True)
class Flow:
    """Steps and the ends a following part of a chain attaches to (``exits``)."""

    steps: list[Step]
    exits: list[Step]


def _flow(part: Step | Flow) -> Flow:
    if isinstance(part, Step):
        return Flow([part], [part])
    if isinstance(part, Flow):
        return part
    raise InvalidJob(f"A workflow is made of steps (job.step(...)), got {part!r}.")


def chain(*parts: Step | Flow) -> Flow:
    """Each part waits for the one before it (for a group: for its callback, or all members)."""
    if not parts:
        raise InvalidJob("chain() needs at least one step.")
    flows = [_flow(part) for part in parts]
    for before, after in itertools.pairwise(flows):
        inside = set(map(id, after.steps))
        entries = [s for s in after.steps if all(id(a) not in inside for a in s.after)]
        for step in entries:
            step.after.extend(before.exits)
    return Flow([s for f in flows for s in f.steps], flows[-1].exits)


def group(parts: Iterable[Step | Flow], *, then: Step | None = None) -> Flow:
    """Parts that run side by side; ``then``: a callback that runs exactly once when every member
    has reached a final state, whatever its outcome (given the outcomes: ``workflow_outcomes``)."""
    steps: list[Step] = []
    exits: list[Step] = []
    for part in parts:
        flow = _flow(part)
        steps.extend(flow.steps)
        exits.extend(flow.exits)
    if then is None:
        return Flow(steps, exits)
    if not isinstance(then, Step):
        raise InvalidJob(f"group(then=...) takes a step (job.step(...)), got {then!r}.")
    then.after.extend(exits)
    then.always = True
    steps.append(then)
    return Flow(steps, [then])


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowHandle:
    """An enqueued workflow: its id, and its state read back (in public, by id)."""

    workflow_id: str
    name: str
    schema_name: str | None

    def refresh(self) -> Workflow:
        """The workflow's row now (status, counters). From a tenant's context only that
        tenant's workflow: another's raises ``Workflow.DoesNotExist``, as an unknown id."""
        row = history.load(self.workflow_id)
        if row is None:
            raise Workflow.DoesNotExist(f"No workflow {self.workflow_id} in this tenant.")
        return row

    @property
    def status(self) -> str:
        """``running`` until every step is final, then succeeded, failed or cancelled."""
        return self.refresh().status

    def steps(self) -> dict[str, str]:
        """Each step's state, by key (for a group of thousands, read the counters instead)."""
        self.refresh()  # the tenant's check
        rows = WorkflowStep.objects.filter(workflow_id=self.workflow_id).values_list("key", "state")
        return dict(rows)

    def wait(self, timeout: float) -> WorkflowHandle:
        """Block until the workflow has ended (every step final), at most ``timeout`` seconds
        (``WaitTimeout`` then); ``status`` and ``steps()`` then say how. Without polling: the
        finish that ends it signals (``enqueueing/waiting``)."""
        waiting.wait(self.workflow_id, conf.get().DEFAULT_QUEUE, timeout, self._ended, self._what())
        return self

    async def await_result(self, timeout: float) -> WorkflowHandle:
        """``wait()`` for async code."""
        queue = conf.get().DEFAULT_QUEUE
        await waiting.await_(self.workflow_id, queue, timeout, self._ended, self._what())
        return self

    def _ended(self) -> bool:
        row = self.refresh()
        return row.finished_at is not None and row.steps_pending == 0

    def _what(self) -> str:
        return f"Workflow {self.workflow_id} ({self.name})"

    def cancel(self, *, by: Any = None) -> bool:
        """Cancel every step that has not finished (``workflow_release.cancel``)."""
        return cancel(uuid.UUID(self.workflow_id), by=by)


@dataclasses.dataclass(slots=True)
class WorkflowSpec:
    """A workflow built and checked, not yet enqueued."""

    flow: Flow
    name: str
    stop_on_failure: bool = False
    sequential: bool = False
    sequence_key: str = ""

    def enqueue(self, *, tenant: Any = None) -> WorkflowHandle:
        """Enqueue the workflow as one unit, on commit, in ``tenant`` (or the current one)."""
        return enqueue(self, tenant=tenant)


def workflow(
    part: Step | Flow,
    *,
    name: str,
    stop_on_failure: bool = False,
    sequential: bool = False,
    sequential_key: str | None = None,
) -> WorkflowSpec:
    """``workflow(chain(a.step(), b.step()), name="import")``: see the module docstring.
    ``sequential``: one workflow of this name per tenant at a time; a later one waits.
    ``sequential_key``: the same, per key of the tenant (``str(account.pk)``): one workflow of
    this name per tenant and key at a time (implies ``sequential``)."""
    if not isinstance(name, str) or not name or len(name) > 200:
        raise InvalidJob(f"workflow() needs a name of 1 to 200 characters, got {name!r}.")
    if sequential_key is None:
        return WorkflowSpec(_flow(part), name, stop_on_failure, sequential)
    if not isinstance(sequential_key, str) or not sequential_key or len(sequential_key) > 200:
        raise InvalidJob(
            "workflow(sequential_key=...) takes a text of 1 to 200 characters naming what the "
            f"turns are per (str(account.pk), say), got {sequential_key!r}."
        )
    problem = text_problem(sequential_key)
    if problem:
        raise InvalidJob(f"workflow(sequential_key=...) {problem}; pass plain text.")
    return WorkflowSpec(_flow(part), name, stop_on_failure, True, sequential_key)


def _ordered(flow: Flow) -> list[Step]:
    """The steps, each once, checked: keys unique, dependencies inside the workflow, no cycle."""
    steps = list(dict.fromkeys(flow.steps))
    members = set(map(id, steps))
    keys: set[str] = set()
    for index, step in enumerate(steps):
        if step.enqueued:
            raise InvalidJob(f"{step!r} was already enqueued in a workflow; build a new step.")
        for other in step.after:
            if id(other) not in members:
                raise InvalidJob(
                    f"{step!r} waits for {other!r}, which is not a step of this workflow (another "
                    "workflow's, or another tenant's): a step waits only for steps of its own "
                    "workflow. Put both in one workflow."
                )
        step.key = step.key or f"{index}:{step.definition.name.rsplit('.', 1)[-1]}"
        if step.key in keys:
            raise InvalidJob(f"Two steps of the workflow have the key {step.key!r}.")
        keys.add(step.key)
    _check_acyclic(steps)
    return steps


def _check_acyclic(steps: list[Step]) -> None:
    waiting = {id(s): len(set(map(id, s.after))) for s in steps}
    dependents: dict[int, list[Step]] = {}
    for step in steps:
        for other in dict.fromkeys(step.after):
            dependents.setdefault(id(other), []).append(step)
    ready = [s for s in steps if waiting[id(s)] == 0]
    seen = 0
    while ready:
        step = ready.pop()
        seen += 1
        for dependent in dependents.get(id(step), ()):
            waiting[id(dependent)] -= 1
            if waiting[id(dependent)] == 0:
                ready.append(dependent)
    if seen != len(steps):
        raise InvalidJob("The workflow's steps wait for each other in a cycle: none could start.")


def _check_step(step: Step, schema: str | None) -> None:
    definition = step.definition
    if definition.per_tenant or (definition.system and schema is not None):
        raise InvalidJob(
            f"Step {step.key!r}: {definition.name!r} is a "
            f"{'per_tenant fan-out' if definition.per_tenant else 'system job'}; a workflow's "
            "steps run in the workflow's tenant. Use a tenant job (or a system workflow of "
            "system jobs, enqueued without a tenant)."
        )
    if (
        definition.unique is not None
        or definition.concurrency in _REFUSED_CONCURRENCY
        or (definition.max_per_tenant is not None)
    ):
        raise InvalidJob(
            f"Step {step.key!r}: {definition.name!r} has unique=, max_per_tenant= or "
            f"concurrency={definition.concurrency!r}, which may refuse a run; a workflow's steps "
            "always run. Use a job without them as the step."
        )
    validated(definition, step.kwargs)


def enqueue(spec: WorkflowSpec, *, tenant: Any = None) -> WorkflowHandle:
    """Write the workflow (in the caller's transaction) and push its first steps on commit."""
    if followups.current() is not None:
        raise InvalidJob(
            "A workflow is enqueued from a request, a command or a test, not inside a run: "
            "enqueue a job that the workflow's first step does instead."
        )
    steps = _ordered(spec.flow)
    schema = resolve_schema(steps[0].definition, tenant)
    for step in steps:
        if resolve_schema(step.definition, tenant if tenant is not None else schema) != schema:
            raise InvalidJob(f"Step {step.key!r} would run in another tenant than the workflow.")
        _check_step(step, schema)
    now = timezone.now()
    wf = Workflow(
        name=spec.name,
        schema_name=schema or "",
        status=RunStatus.RUNNING,
        stop_on_failure=spec.stop_on_failure,
        sequential=spec.sequential,
        sequence_key=spec.sequence_key,
        created_at=now,
        correlation_id=origin.correlation_id(),
        steps_total=len(steps),
        steps_pending=len(steps),
    )
    with transaction.atomic():
        if spec.sequential:
            history.turn_lock(wf)
            if history.has_turn_taken(wf):
                wf.status = RunStatus.QUEUED  # its first steps get runs when its turn comes
        wf.save(force_insert=True)
        for chunk in _chunks(steps):
            _write_chunk(wf, chunk, schema, start=wf.status == RunStatus.RUNNING)
        transaction.on_commit(functools.partial(push_released, wf.workflow_id), robust=True)
    for step in steps:
        step.enqueued = True
    return WorkflowHandle(str(wf.workflow_id), wf.name, schema)


def _chunks(steps: list[Step]) -> Iterator[list[Step]]:
    for start in range(0, len(steps), CHUNK):
        yield steps[start : start + CHUNK]


def _write_chunk(wf: Workflow, chunk: list[Step], schema: str | None, *, start: bool) -> None:
    """One chunk's step rows, and the run rows of its steps that wait for nothing."""
    step_rows, run_rows = [], []
    for step in chunk:
        after = list(dict.fromkeys(step.after))
        row = WorkflowStep(
            workflow=wf,
            key=step.key or "",
            job_name=step.definition.name,
            kwargs=step.kwargs,
            dependents=[],
            always=step.always,
            waiting_on=len(after),
            preds_total=len(after),
            state=StepState.RELEASED if start and not after else StepState.WAITING,
        )
        if start and not after:
            run = _root_run(wf, step, schema)
            row.run_id = run.run_id
            run_rows.append(run)
        step_rows.append(row)
    WorkflowStep.objects.bulk_create(step_rows)
    JobRun.objects.bulk_create(run_rows)
    _link(wf, chunk)


def _link(wf: Workflow, chunk: list[Step]) -> None:
    """Record, on each predecessor, the keys of this chunk's steps that wait for it (one
    statement per chunk: predecessors may be in earlier chunks)."""
    adds: dict[str, list[str]] = {}
    for step in chunk:
        for other in dict.fromkeys(step.after):
            assert other.key is not None and step.key is not None
            adds.setdefault(other.key, []).append(step.key)
    if not adds:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {WorkflowStep._meta.db_table} AS s SET dependents = s.dependents || v.keys "
            "FROM (SELECT k, jsonb_agg(d) AS keys FROM unnest(%s::text[], %s::text[]) AS u(k, d) "
            "GROUP BY k) AS v WHERE s.workflow_id = %s AND s.key = v.k",
            [
                [k for k, ds in adds.items() for _ in ds],
                [d for ds in adds.values() for d in ds],
                wf.workflow_id,
            ],
        )


def _root_run(wf: Workflow, step: Step, schema: str | None) -> JobRun:
    definition = step.definition
    env = new_envelope(definition, schema, step.kwargs, None, f"workflow:{wf.name}")
    # Built to be checked now (size), then dropped: the push rebuilds it from the row.
    check_size(definition, env, message_for(definition, env, 0.0))
    row = row_for(definition, env, validated(definition, step.kwargs), 0.0)
    row.workflow_id = wf.workflow_id
    return row
