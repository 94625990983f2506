"""The registry: every declared job, found by name.

Filled while the apps load (each ``@job`` registers its definition) and frozen in
``AppConfig.ready``, so a web process and every worker know the same jobs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..core.exceptions import InvalidJob, JobNotRegistered
from .job import JobDefinition


class Registry:
    """Job definitions by name. Frozen after ``AppConfig.ready`` so workers and web agree."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobDefinition] = {}
        self._frozen = False

    def register(self, definition: JobDefinition) -> JobDefinition:
        """Add a job; refuse a second job under the same name, or any job once frozen (a job
        declared late is one some workers would not know). Re-registering the same function
        (a module imported twice) replaces it."""
        existing = self._jobs.get(definition.name)
        if existing is not None:
            same_code = (existing.func.__module__, existing.func.__qualname__) == (
                definition.func.__module__,
                definition.func.__qualname__,
            )
            if not same_code:
                raise InvalidJob(
                    f"Two jobs are named {definition.name!r}: "
                    f"{existing.func.__module__}.{existing.func.__qualname__} and "
                    f"{definition.func.__module__}.{definition.func.__qualname__}. "
                    "Give one of them @job(name='...')."
                )
        elif self._frozen:
            raise InvalidJob(
                f"Job {definition.name!r} was declared after start-up. Declare jobs in an "
                "installed app's jobs.py so that every worker knows them."
            )
        self._jobs[definition.name] = definition
        return definition

    def get(self, name: str) -> JobDefinition:
        """The job named ``name``; ``JobNotRegistered`` (listing known jobs) otherwise."""
        try:
            return self._jobs[name]
        except KeyError:
            raise JobNotRegistered(
                f"No job named {name!r} is registered. Known jobs: {sorted(self._jobs)[:20]}"
            ) from None

    @contextmanager
    def override(self, *definitions: JobDefinition) -> Iterator[None]:
        """These definitions, by name, for the block, even once frozen; afterwards the registry
        is as it was. For tests and benchmarks, which declare jobs after start-up on purpose:
        the freeze exists to keep workers and web processes agreeing, which a test controls."""
        saved = {d.name: self._jobs.get(d.name) for d in definitions}
        self._jobs.update({d.name: d for d in definitions})
        try:
            yield
        finally:
            for name, previous in saved.items():
                if previous is None:
                    self._jobs.pop(name, None)
                else:
                    self._jobs[name] = previous

    def freeze(self) -> None:
        """Refuse new jobs from now on (called in ``AppConfig.ready``)."""
        self._frozen = True

    def listeners(self, event: str) -> list[JobDefinition]:
        """Jobs declared ``on=`` this event, in name order."""
        return [d for d in self if event in d.on]

    def __iter__(self) -> Iterator[JobDefinition]:
        return iter(sorted(self._jobs.values(), key=lambda d: d.name))

    def __contains__(self, name: object) -> bool:
        return name in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)


registry = Registry()
