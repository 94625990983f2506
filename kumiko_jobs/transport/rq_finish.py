"""RQ's finish of a successful job, sent as one script instead of a ``MULTI``/``EXEC``.

The worker's finish (``rq_worker.py``, ``_finalize_success``) lets RQ's own code write what RQ
writes (the job's status and fields, the result stream, ``FinishedJobRegistry``, the
execution's removal, the worker's counters and state) onto a redis-py pipeline, with kumiko's
``done`` signal and the fair charge beside them. A transaction of some twenty commands costs the
worker more than the one round trip: redis-py packs each command, and parses a ``QUEUED``
reply for each and then each answer in ``EXEC``'s. Here the commands RQ queued are read back
from the pipeline and sent as the arguments of one script, which runs them in order with
``redis.pcall`` (as ``EXEC`` runs them: an error in one does not stop the others) and returns
their answers: the same commands, in the same order, as atomic as the transaction was, with one
command to pack and one reply to parse. The fair charge, itself a script (``fair_charge.py``),
runs inside it as a function.

Sent with ``EVALSHA``; a server that does not know the script (a restart, a failover, a
``SCRIPT FLUSH``) answers ``NOSCRIPT`` before running anything, and it is loaded and sent
again. A pipeline holding a command the script cannot run (a script of
another kind) is executed as the transaction it is.
"""

from __future__ import annotations

import hashlib
from typing import Any

from redis import Redis
from redis.exceptions import NoScriptError, ResponseError

from .fair_charge import CHARGE_SCRIPT

# The marker that stands for the fair charge's EVAL among the commands.
_CHARGE = "kumiko:charge"

# ARGV: for each command, its number of words, then the words. The charge's own script is a
# function here: its ARGV is its parameter (it reads no KEYS).
_SCRIPT = (
    "local function charge(ARGV)\n"
    + CHARGE_SCRIPT
    + f"""
end
local i, n, out = 1, #ARGV, {{}}
while i <= n do
  local count = tonumber(ARGV[i])
  if ARGV[i + 1] == '{_CHARGE}' then
    out[#out + 1] = charge({{unpack(ARGV, i + 2, i + count)}})
  else
    out[#out + 1] = redis.pcall(unpack(ARGV, i + 1, i + count))
  end
  i = i + count + 1
end
return out
"""
)

_SHA = hashlib.sha1(_SCRIPT.encode()).hexdigest()


def _words(pipeline: Any) -> list[Any] | None:
    """The pipeline's commands as the script's ARGV, or None if one cannot run inside it."""
    words: list[Any] = []
    for args, _options in pipeline.command_stack:
        name = str(args[0]).upper()
        if name == "EVAL" and args[1] == CHARGE_SCRIPT and str(args[2]) == "0":
            words.append(len(args) - 2)
            words.append(_CHARGE)
            words.extend(args[3:])
        elif name in {"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "MULTI", "EXEC"}:
            return None
        else:
            words.append(len(args))
            words.extend(args)
    return words


def commands_in(args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """The commands a call of the finish script carries (``args``: the ``EVALSHA`` command's
    words, as redis-py's ``execute_command`` receives them); [] for any other command. For
    whoever reads the worker's commands (tests, a debugger), as a pipeline's are read."""
    if len(args) < 3 or args[0] != "EVALSHA" or args[1] != _SHA:
        return []
    words, found, i = args[3:], [], 0
    while i < len(words):
        count = int(words[i])
        found.append(tuple(words[i + 1 : i + 1 + count]))
        i += count + 1
    return found


def execute(connection: Redis, pipeline: Any) -> list[Any]:
    """Run ``pipeline``'s commands as one script call on ``connection``; their answers, raw
    (integers and strings: the finish reads counts and flags, not redis-py's callbacks).

    Raises the first error among the answers, as ``execute()`` does, after every command ran.
    """
    words = _words(pipeline)
    if words is None:
        return list(pipeline.execute())
    pipeline.reset()
    try:
        answers = connection.evalsha(_SHA, 0, *words)
    except NoScriptError:  # nothing ran: load it, send it again
        connection.script_load(_SCRIPT)
        answers = connection.evalsha(_SHA, 0, *words)
    for answer in answers:
        if isinstance(answer, ResponseError):
            raise answer
    return list(answers)
