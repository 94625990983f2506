"""The wheel the repository builds holds everything the docs use.

``kumiko-jobs`` is not on the package index yet: README ("Use it in your project") and
docs/tutorial.md install it from a clone or from a wheel built here. A wheel that lacks the
admin's templates, the translations, ``py.typed``, the migrations or the management command
installs fine and breaks at the first page, ``migrate`` or ``manage.py kumiko_jobs``. Built with
the build backend already in the venv (``--no-build-isolation``, no index), from a copy of the
package, so that the work tree gets no ``build/`` directory.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kumiko_jobs"


def package_files() -> set[str]:
    """Every file of the package in the source tree, but bytecode."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        PACKAGE, source / "kumiko_jobs", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "-w",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = out.glob("kumiko_jobs-*.whl")
    with zipfile.ZipFile(path) as archive:
        return archive.namelist()


def test_the_wheel_holds_every_file_of_the_package(wheel: list[str]) -> None:
    missing = sorted(package_files() - set(wheel))
    assert not missing, f"the wheel lacks {missing}: add them to [tool.setuptools.package-data]"


@pytest.mark.parametrize(
    "part",
    [
        "kumiko_jobs/py.typed",
        "kumiko_jobs/templates/admin/kumiko_jobs/jobrun/change_list.html",
        "kumiko_jobs/templates/admin/kumiko_jobs/jobrun/run_job.html",
        "kumiko_jobs/locale/de/LC_MESSAGES/django.po",
        "kumiko_jobs/locale/de/LC_MESSAGES/django.mo",
        "kumiko_jobs/migrations/__init__.py",
        "kumiko_jobs/migrations/0001_initial.py",
        "kumiko_jobs/management/commands/kumiko_jobs.py",
        "kumiko_jobs/testing/__init__.py",
    ],
)
def test_the_wheel_holds_what_the_docs_use(wheel: list[str], part: str) -> None:
    assert part in wheel


def test_every_kind_of_data_file_is_declared(wheel: list[str]) -> None:
    """Templates, translations and static files, whichever exist: each kind is in the wheel
    (a new kind of file, e.g. the first static file, must be declared to ship)."""
    for kind in ("templates/", "locale/", "static/"):
        here = {f for f in package_files() if f.startswith(f"kumiko_jobs/{kind}")}
        assert here <= set(wheel), sorted(here - set(wheel))
    assert not [n for n in wheel if n.startswith(("tests/", "example_project/", "bench/"))]
