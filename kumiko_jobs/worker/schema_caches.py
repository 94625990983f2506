"""Django's process-wide ContentType cache, kept per slot and per schema once slots start.

``ContentTypeManager`` caches content types in one dict per process, keyed by database alias
only. With django-tenants a content type's id differs per schema, and django-tenants empties
the cache on every schema switch (``set_tenant``), which is enough while runs take turns. Slots
overlap: a run of one tenant filled the cache in its slot while a run of another tenant, in
another slot, read that tenant's id back (``get_for_model``, ``get_for_id``, natural keys), with
no query, so neither the guard nor the tenant's login ever saw it. Generic relations, the
admin's log and permissions would then point at the other tenant's rows.

``key_by_schema()`` (the worker calls it as it starts its slots) replaces the manager's cache
with ``SchemaKeyedCache``: each entry under (alias, thread, schema of the thread's connection for
that alias). Every access of Django's manager goes through ``[alias]``, ``setdefault(alias,
...)`` or ``clear()`` (Django's ``ContentTypeManager``), so none bypasses the key; a
``clear()``, from any thread, still empties every entry, so django-tenants' clear on a switch
and Django's own invalidations keep working. Per thread as well as per schema: an id one slot
read inside its open transaction (or made with ``get_or_create``) is not another slot's to use
before that commits.

The cost is a thread id and a connection lookup per cached read (measured: 2.6 instead of 1.7
us per cached ``get_for_model``), which one slot does not need: with one slot nothing else runs
tenant code beside its run, so the cache stays Django's.
What else a run reaches through Django that the process shares is in docs/design.md, "Slots".
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, MutableMapping
from typing import Any

from django.apps import apps
from django.db import connections

_install_lock = threading.Lock()


def _key(alias: str) -> tuple[str, int, str | None]:
    return (alias, threading.get_ident(), getattr(connections[alias], "schema_name", None))


class SchemaKeyedCache(MutableMapping[str, Any]):
    """A mapping of database alias to Django's per-alias content type dict, whose entries are
    kept per thread and per schema of that thread's connection (module docstring)."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, int, str | None], Any] = {}

    def __getitem__(self, alias: str) -> Any:
        return self._entries[_key(alias)]

    def __setitem__(self, alias: str, value: Any) -> None:
        self._entries[_key(alias)] = value

    def __delitem__(self, alias: str) -> None:
        del self._entries[_key(alias)]

    def setdefault(self, alias: str, default: Any = None) -> Any:
        # One dict operation (MutableMapping's would be a read, then a write).
        return self._entries.setdefault(_key(alias), default)

    def clear(self) -> None:
        """Every entry, of every thread and schema (django-tenants clears on every switch)."""
        self._entries.clear()

    def __iter__(self) -> Iterator[str]:
        """The aliases this thread has entries for in its connections' current schemas."""
        return iter([key[0] for key in list(self._entries) if key == _key(key[0])])

    def __len__(self) -> int:
        return sum(1 for _ in self)


def key_by_schema() -> None:
    """Key the ContentType cache per thread and schema (once; nothing without contenttypes)."""
    if not apps.is_installed("django.contrib.contenttypes"):
        return
    # A model module: importable only with contenttypes installed, hence here.
    from django.contrib.contenttypes.models import ContentType

    with _install_lock:
        manager: Any = ContentType.objects
        if not isinstance(manager._cache, SchemaKeyedCache):
            manager._cache = SchemaKeyedCache()
