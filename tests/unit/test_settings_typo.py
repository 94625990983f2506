"""A typo in KUMIKO_JOBS is the system check kumiko_jobs.E001, printed without a traceback.

Each command runs in a subprocess with a settings module whose KUMIKO_JOBS has a typo'd key,
because the failure this guards against happened inside django.setup(), before any command.
The commands stop at the system checks, so no database or Redis is needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def manage(tmp_path: Path, kumiko_jobs: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "typo_settings.py").write_text(
        f"from example_project.settings import *  # noqa: F403\nKUMIKO_JOBS = {kumiko_jobs}\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "typo_settings"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "command",
    [
        ["check"],
        ["check", "--deploy"],
        ["migrate", "--plan"],
        ["kumiko_jobs", "list"],
        ["rqworker", "--burst"],
    ],
    ids=" ".join,
)
def test_typo_is_the_check_error_not_a_traceback(tmp_path: Path, command: list[str]) -> None:
    result = manage(tmp_path, '{"DEFAULT_RETRIESS": 3}', *command)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "(kumiko_jobs.E001) settings.KUMIKO_JOBS has an unknown key 'DEFAULT_RETRIESS'" in (
        result.stderr
    )
    assert "Did you mean 'DEFAULT_RETRIES'?" in result.stderr
    assert "Traceback" not in result.stderr


def test_valid_settings_pass_the_same_check(tmp_path: Path) -> None:
    # Calibration: the same subprocess with the key spelled right passes the checks, so the
    # error above comes from the typo and not from the harness.
    result = manage(tmp_path, '{"DEFAULT_RETRIES": 3}', "check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "E001" not in result.stderr + result.stdout
