"""Secret scrubbing of free text (exception messages, stack traces, ``ctx.log`` lines).

Text whose shape we do not control often echoes tenant data and sometimes credentials. Every
place that sends such text out of the operator-only attempt record (the failure log line, the
span's exception event, ``ctx.log`` records) goes through :func:`scrub`.

Linear time on any input, because a worker runs this after a job failed, possibly after RQ's
timeout alarm has already been spent:

* the text is **truncated first** (``limit``), then scrubbed, so the cost is bounded by the
  limit whatever the job put into its exception;
* every pattern starts with a literal (a sensitive key, ``://`` or ``bearer``), so the engine
  only does real work where such a literal occurs; every repetition is bounded and no
  quantified group contains another quantifier over the same characters, so a failed attempt
  backtracks over at most a few hundred characters; a value pattern, once it starts, always
  matches (its closing quote or bracket is optional), so values are consumed, never re-scanned.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

MASK = "***"
# What scrub() keeps of a text by default: a stack trace of a few dozen frames.
DEFAULT_LIMIT = 16_384
TRUNCATED = " [... {} more characters]"
# A value is masked up to this many characters. The texts we scrub are truncated to far
# less, so in practice a value is masked to its end, while the repetition stays bounded.
_VALUE_MAX = 65_536

# Between a key and its value: an optional closing quote (possibly escaped, for JSON inside a
# string), a separator (=, :, Ruby's =>, or URL-encoded = and :) and a little blank space.
_SEP = r"""(?:\\?["'])?[ \t]{0,16}(?:=>|[=:]|%3[dDaA])[ \t]{0,16}"""
_V = _VALUE_MAX
# The value after a separator, first alternative that applies. Each one matches as soon as its
# opening character does (closers are optional), so none backtracks over a long value.
_VALUE = (
    "(?:"
    rf"""[bBuUrR]{{0,2}}"(?:[^"\\\n]|\\.){{0,{_V}}}"?"""  # "a\"b", b"...": escapes honoured
    rf"""|[bBuUrR]{{0,2}}'(?:[^'\\\n]|\\.){{0,{_V}}}'?"""
    rf"""|\\"[^"\n]{{0,{_V}}}"?"""  # \"...\" (JSON quoted inside a string)
    rf"|\[[^\]\n]{{0,{_V}}}\]?"  # a list: ['a', 'b']
    rf"|\([^)\n]{{0,{_V}}}\)?"  # a tuple: ('a',)
    rf"|\{{[^}}\n]{{0,{_V}}}\}}?"  # a dict
    rf"""|(?:bearer|basic|digest|token|negotiate)[ \t]{{1,16}}[^\s,;&'"]{{1,{_V}}}"""
    rf"""|[^\s,;&'")\]}}]{{1,{_V}}}"""  # a bare token up to the next separator
    ")"
)
# scheme://user:password@host. The password runs to the LAST "@" of the authority, so a
# password that contains "@" is hidden whole; the user may be empty (redis://:pw@host).
_URL_PASSWORD = re.compile(
    r"""(?P<head>://[^\s/?#@:'"]{0,256}:)(?P<secret>[^\s/'"]{1,1024})(?=@)"""
)
# A bearer token standing alone ("... sent Bearer eyJ...").
_BEARER = re.compile(r"(?P<head>\bbearer[ \t]{1,16})[A-Za-z0-9._~+/=-]{8,4096}", re.IGNORECASE)


def _key_regex(key: str) -> str:
    """A configured key as a pattern: "_" also matches "-", "." or " " (X-Api-Key, api.key)."""
    parts = [re.escape(part) for part in key.lower().replace("-", "_").split("_") if part]
    return r"[-_. ]?".join(parts)


@lru_cache(maxsize=8)
def _key_value_pattern(keys: tuple[str, ...]) -> re.Pattern[str] | None:
    regexes = {_key_regex(k) for k in keys if k.strip("_- .")}
    alternatives = "|".join(sorted(regexes, key=len, reverse=True))
    if not alternatives:
        return None
    # The key's literal comes first: the engine starts real work only where it occurs. What
    # precedes it (DB_, X-, a quote) stays as it is; what follows it up to the separator is
    # part of the key (password_hash, api_key_v2).
    return re.compile(
        rf"(?P<key>(?:{alternatives})[\w.-]{{0,40}})(?P<sep>{_SEP})(?P<value>{_VALUE})",
        re.IGNORECASE,
    )


_SEPARATORS = str.maketrans("", "", "-_. ")


def normalized_key(key: str) -> str:
    """``key`` lower-cased without separators, so ``API-Key``, ``api_key`` and ``apikey`` all match
    the same sensitive name.
    """
    return key.lower().translate(_SEPARATORS)


@lru_cache(maxsize=8)
def _normalized_keys(keys: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(n for n in map(normalized_key, keys) if n)


def is_sensitive_key(key: str, keys: Iterable[str]) -> bool:
    """Whether a field named ``key`` holds a secret (its whole value is then masked)."""
    name = normalized_key(key)
    return any(k in name for k in _normalized_keys(tuple(keys)))


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters plus a marker saying how much was dropped.

    The cut moves back to the last whitespace, so no half token (half a URL, half a
    ``key=value``) survives that the scrubber would no longer recognise; a text without any
    whitespace before the limit keeps only the marker.
    """
    if len(text) <= limit:
        return text
    head = text[:limit]
    space = max(head.rfind(" "), head.rfind("\t"), head.rfind("\n"))
    head = head[: space + 1]
    return head + TRUNCATED.format(len(text) - len(head))


def _mask_value(match: re.Match[str]) -> str:
    return f"{match.group('key')}{match.group('sep')}{_masked(match.group('value'))}"


def _masked(value: str) -> str:
    """The value's opening (and closing) quote or bracket around the mask, nothing else."""
    stripped = value.lstrip("bBuUrR")
    opener = stripped[:1]
    if opener in ("'", '"'):
        prefix = value[: len(value) - len(stripped) + 1]
        closer = opener if len(stripped) > 1 and stripped.endswith(opener) else ""
        return f"{prefix}{MASK}{closer}"
    if value.startswith('\\"'):
        return f'\\"{MASK}\\"'
    if value[:1] in ("[", "(", "{"):
        closer = {"[": "]", "(": ")", "{": "}"}[value[0]]
        return f"{value[0]}{MASK}{closer if value.endswith(closer) else ''}"
    return MASK


def scrub_bounded(text: str, keys: Iterable[str]) -> str:
    """The scrubbing passes on ``text`` as it is; callers truncate first (:func:`scrub`)."""
    pattern = _key_value_pattern(tuple(k.lower() for k in keys))
    if pattern is not None:
        text = pattern.sub(_mask_value, text)
    text = _URL_PASSWORD.sub(lambda m: f"{m.group('head')}{MASK}", text)
    return _BEARER.sub(lambda m: f"{m.group('head')}{MASK}", text)


def scrub(text: str, keys: Iterable[str], *, limit: int = DEFAULT_LIMIT) -> str:
    """``text`` truncated to ``limit`` characters, with secret values replaced by ``***``."""
    if not text:
        return text
    return scrub_bounded(truncate(text, limit), keys)
