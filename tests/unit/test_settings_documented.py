"""Every ``KUMIKO_JOBS`` key and every ``@job`` option is documented in docs/settings.md.

A setting or option added without its row is one a user cannot find; the row is named by the
key in backquotes in the first column (``| `FAIRNESS` |``), as the page writes them.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from kumiko_jobs.core.conf import KumikoSettings
from kumiko_jobs.definition.options import _OPTION_TYPES

SETTINGS_MD = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def documented_rows() -> set[str]:
    return set(re.findall(r"^\| `([A-Za-z_]+)` \|", SETTINGS_MD.read_text(), re.M))


def test_every_setting_has_its_row() -> None:
    missing = [
        f.name for f in dataclasses.fields(KumikoSettings) if f.name not in documented_rows()
    ]
    assert missing == [], f"KUMIKO_JOBS keys without a row in docs/settings.md: {missing}"


def test_every_job_option_has_its_row() -> None:
    missing = [name for name in _OPTION_TYPES if name not in documented_rows()]
    assert missing == [], f"@job options without a row in docs/settings.md: {missing}"


def test_calibration_an_undocumented_name_is_seen() -> None:
    assert "FAIRNESS" in documented_rows() and "rate_limit" in documented_rows()
    assert "NO_SUCH_SETTING" not in documented_rows()
