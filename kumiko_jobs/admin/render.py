"""How the admin shows history values: status badges, durations, times, subjects, failure
sentences, JSON, tracebacks and log lines.

Shared by the run, attempt and failure pages of both audiences, so that a status or a
duration reads the same on each. Plain functions that return escaped HTML (``format_html``);
what a tenant may read is decided by the admins that call them, not here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.timezone import localtime
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..definition.registry import registry
from ..models import RunStatus

# Text on a coloured background; chosen for contrast on both light and dark admin themes.
_BADGE_COLOURS: dict[str, str] = {
    RunStatus.QUEUED: "#57606a",
    RunStatus.RUNNING: "#0969da",
    RunStatus.DEFERRED: "#9a6700",
    RunStatus.SUCCEEDED: "#1a7f37",
    RunStatus.FAILED: "#cf222e",
    RunStatus.CANCELLED: "#6e7781",
    RunStatus.SKIPPED: "#8c959f",
    RunStatus.CAPPED: "#bc4c00",
}


def status_badge(status: str) -> SafeString:
    """A run's status as a coloured, translated badge (an unknown status is shown as it is)."""
    label = RunStatus(status).label if status in RunStatus.values else status
    return format_html(
        '<span class="kj-status kj-status-{}" style="background:{};color:#fff;'
        'border-radius:9px;padding:1px 8px;font-size:0.85em;white-space:nowrap">{}</span>',
        status,
        _BADGE_COLOURS.get(status, "#57606a"),
        label,
    )


def human_duration(ms: float | None) -> str:
    """Milliseconds as a person reads them (``850 ms``, ``2.5 s``, ``3 min 4 s``, ``1 h 2 min``);
    "—" when unknown.
    """
    if ms is None:
        return "—"
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def short_time(value: datetime | None) -> str:
    """A compact local date and time for list columns (the detail page shows the long form)."""
    if value is None:
        return "—"
    return date_format(localtime(value), "SHORT_DATETIME_FORMAT")


def subject_html(subject: str) -> SafeString | str:
    """A subject for a list cell: short ones (``invoice_id=7``) kept on one line, long ones left to
    wrap, "—" when empty.
    """
    # Short subjects (invoice_id=7) read best unbroken; long ones may wrap.
    if not subject:
        return "—"
    if len(subject) > 40:
        return subject
    return format_html('<span style="white-space:nowrap">{}</span>', subject)


def job_title(job_name: str) -> str:
    """What a tenant reads for a job: the first line of its description, else its name."""
    definition = registry.get(job_name) if job_name in registry else None
    description = definition.description.strip() if definition else ""
    if not description:
        return job_name
    # Projects may translate their job descriptions; untranslated text passes unchanged.
    return gettext(description.splitlines()[0])


def failure_sentence(message_key: str | None) -> str:
    """A failure's message key as a sentence in the request's language.

    The key is the msgid (``billing.sync_failed``); a key the project has not translated is
    shown as it is, which is still safe: keys are chosen by developers, never error text.
    """
    if not message_key:
        return ""
    return gettext(message_key)


# Inline styles, because a reusable app's templates cannot rely on the project's CSS pipeline.
_PRE_STYLE = "white-space:pre-wrap;max-height:32em;overflow:auto;margin:0;font-size:0.85em"


def pretty_json(value: Any) -> SafeString:
    """A JSON value indented and key-sorted in a scrollable block, for payloads and results."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre class="kj-pre" style="{}">{}</pre>', _PRE_STYLE, text)


def pre(text: str) -> SafeString | str:
    """Text (a traceback, an error) preformatted in a scrollable block, or "—" when empty."""
    if not text:
        return "—"
    return format_html('<pre class="kj-pre" style="{}">{}</pre>', _PRE_STYLE, text)


def log_table(lines: Sequence[dict[str, Any]]) -> SafeString | str:
    """A run's captured log records as a table of time, level, message and extra data; "—" when
    there are none.
    """
    if not lines:
        return "—"

    def row(line: dict[str, Any]) -> tuple[str, str, str, str]:
        stamp = line.get("t")
        when = (
            datetime.fromtimestamp(stamp, tz=UTC).strftime("%H:%M:%S.%f")[:-3]
            if isinstance(stamp, int | float)
            else ""
        )
        data = line.get("data") or {}
        return (
            when,
            str(line.get("level", "")),
            str(line.get("msg", "")),
            json.dumps(data, ensure_ascii=False, default=str) if data else "",
        )

    body = format_html_join(
        "", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", (row(line) for line in lines)
    )
    return format_html(
        '<table class="kj-log"><thead><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr>'
        "</thead><tbody>{}</tbody></table>",
        _("time (UTC)"),
        _("level"),
        _("message"),
        _("data"),
        body,
    )
