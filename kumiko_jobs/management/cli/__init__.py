"""The subcommands of ``manage.py kumiko_jobs``, one module per concern.

Django runs every module of ``management/commands/`` as a command of its own, so the
subcommands live here and ``management/commands/kumiko_jobs.py`` only lists them
(``SUBCOMMANDS``, in the order ``--help`` shows them) and dispatches. Each module's
``Subcommand`` values say the name, the help line, the options and what runs: ``jobs`` (list,
enqueue, runs, retry, cancel), ``maintenance`` (sweep, schedule, relay), ``roles`` (roles,
drop-roles), ``flow`` (pause, resume); ``common`` holds what they share (docs/reference.md,
"Management commands").
"""

from __future__ import annotations
