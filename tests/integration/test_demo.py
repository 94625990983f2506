"""The demo, run the way a newcomer runs it: a subprocess on the real PostgreSQL and Redis.

It gets a database of its own (created by the demo, dropped here), so it neither sees nor
disturbs the test database or a developer's demo. For Redis it uses the suite's own database
(tests/settings.py claims one per suite): no other test runs meanwhile, and the next test
flushes it anyway.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Per suite: two suites running at once (two checkouts, CI) must not share it.
DEMO_DATABASE = f"kumiko_demo_test_{os.getpid()}"


@dataclass(frozen=True)
class TableRow:
    tenant: str
    job: str
    subject: str
    status: str
    tries: str
    note: str


def _with_path(url: str, path: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


def _drop_database(admin_url: str) -> None:
    import psycopg
    from psycopg import sql

    from kumiko_jobs.guard.roles import names as role_names

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DEMO_DATABASE))
        )
        # The demo's tenant roles (DB_ROLES) are cluster-wide: they go with their database.
        role_names.drop_roles_of_dropped_database(conn.cursor(), DEMO_DATABASE)


@pytest.fixture(scope="module")
def demo_env() -> Iterator[dict[str, str]]:
    """The environment of a demo run; its database is dropped before and after the module."""
    # tests/settings.py has already pointed these at servers that answer (real or embedded).
    database_url = os.environ["DATABASE_URL"]
    admin_url = _with_path(database_url, "/postgres")
    _drop_database(admin_url)  # a leftover of an interrupted run would not be a clean start
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        DATABASE_URL=_with_path(database_url, f"/{DEMO_DATABASE}"),
        REDIS_URL=os.environ["REDIS_URL"],
        PYTHONPATH=str(ROOT),
        NO_COLOR="1",
    )
    try:
        yield env
    finally:
        _drop_database(admin_url)


def run_demo(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "example_project.demo", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"demo failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def parse_table(output: str) -> list[TableRow]:
    """The rows of the demo's table, with the tenant filled in on continuation rows."""
    lines = output.splitlines()
    header_at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("TENANT "))
    header = lines[header_at]
    job_col = header.index("JOB")
    rows: list[TableRow] = []
    tenant = ""
    for line in lines[header_at + 1 :]:
        if not line.strip():
            continue  # the blank line between two tenants' groups
        if line.lstrip().startswith("TRIES "):
            break  # the legend under the table
        tenant = line[:job_col].strip() or tenant
        cells = re.split(r"\s{2,}", line[job_col:].strip())
        job, subject, status, tries = cells[:4]
        note = cells[6] if len(cells) > 6 else ""
        rows.append(TableRow(tenant, job, subject, status, tries, note))
    return rows


@pytest.fixture(scope="module")
def first_output(demo_env: dict[str, str]) -> str:
    """The output of the demo on its fresh database (one run shared by the module's tests)."""
    return run_demo(demo_env)


def test_demo_runs_a_mix_of_jobs_in_several_tenants(first_output: str) -> None:
    output = first_output
    rows = parse_table(output)

    assert len({row.tenant for row in rows}) >= 3
    assert {row.status for row in rows} == {"succeeded", "failed"}
    retried = [r for r in rows if r.job == "sync_invoice" and r.tries == "2/4"]
    assert [r.status for r in retried] == ["succeeded"]
    assert "retried after ConnectionError" in retried[0].note
    always_failing = [r for r in rows if r.job == "sync_invoice" and r.status == "failed"]
    assert [r.tries for r in always_failing] == ["4/4"]
    assert "tenant sees billing.sync_failed" in always_failing[0].note
    rejected = [r for r in rows if r.job == "validate_invoice" and r.status == "failed"]
    assert [r.tries for r in rejected] == ["1/1"]
    assert "tenant sees billing.invoice_rejected" in rejected[0].note
    assert "operators see Unrecoverable" in rejected[0].note
    requested = [r for r in rows if "request req-acme-0001 by alice" in r.note]
    assert [(r.tenant, r.job, r.status) for r in requested] == [
        ("acme", "sync_invoice", "succeeded")
    ]
    assert any("follow-up of approve_invoice" in r.note for r in rows)
    assert f"database {DEMO_DATABASE} migrated" in output
    assert re.search(r"^11 runs in 3 tenants: 9 succeeded, 2 failed \(2 retried\)", output, re.M)
    assert "manage.py rqworker" in output and "manage.py rqscheduler --interval 1" in output


def test_demo_again_starts_from_a_clean_slate(demo_env: dict[str, str], first_output: str) -> None:
    """A second run reuses the tenants, forgets the first run's history, and takes --tenants."""
    output = run_demo(demo_env, "--tenants", "4")
    rows = parse_table(output)

    assert re.search(r"clean slate: removed [1-9]\d* history rows", output)
    assert "(1 new)" in output  # only the fourth tenant had to be created
    assert {row.tenant for row in rows} == {"acme", "globex", "initech", "umbrella"}
    assert len(rows) == 12  # the first run's 11 are gone; the new tenant adds one


def test_demo_prints_admin_logins_that_work(demo_env: dict[str, str], first_output: str) -> None:
    """The demo ends with logins for the admin, and they authenticate in their own schema."""
    output = first_output
    assert re.search(
        r"operators\s+http://localhost:8000/admin/\s+user operator\s+password kumiko-demo", output
    ), output
    # The tenant login is the first tenant with a failed run: something to look at.
    assert re.search(
        r"tenant globex\s+http://globex.localhost:8000/admin/\s+user globex-staff\s+"
        r"password kumiko-demo",
        output,
    ), output
    script = (
        "from django.contrib.auth import authenticate\n"
        "from django_tenants.utils import schema_context\n"
        "from kumiko_jobs.models import JobRun\n"
        "for schema, user in (('public', 'operator'), ('globex', 'globex-staff')):\n"
        "    with schema_context(schema):\n"
        "        u = authenticate(username=user, password='kumiko-demo')\n"
        "        print(schema, user, bool(u and u.is_staff), bool(u and u.is_superuser),\n"
        "              bool(u and u.has_perm('kumiko_jobs.view_jobrun')),\n"
        "              bool(u and u.has_perm('kumiko_jobs.view_all_tenants')),\n"
        "              sorted(p.codename for p in u.user_permissions.all()))\n"
        "with schema_context('globex'):\n"
        "    print('wrong', authenticate(username='globex-staff', password='nope') is None)\n"
        "print('globex failed', JobRun.objects.filter(schema_name='globex', status='failed')"
        ".count())\n"
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=demo_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    # (Django 6's shell first says what it imported: skip that line)
    said = [
        line
        for line in result.stdout.splitlines()
        if line.startswith(("public", "globex", "wrong"))
    ]
    assert said == [
        "public operator True True True True ['view_all_tenants']",
        "globex globex-staff True False True False ['view_jobfailure', 'view_jobrun']",
        "wrong True",
        "globex failed 1",
    ], result.stdout + result.stderr


def _next_line(output: str, label: str) -> str:
    (line,) = [x.strip() for x in output.splitlines() if x.strip().startswith(f"{label}: ")]
    return line.split(": ", 1)[1]


def test_the_next_lines_work_as_printed(demo_env: dict[str, str], first_output: str) -> None:
    """The environment line, then the roles line as printed, in a shell from the repository's
    root: it drops the demo database's roles (then ``kumiko_jobs roles`` gives them back, for
    the module's other demo runs). The worker line names the same Python and exists."""
    exports = _next_line(first_output, "Environment")
    assert exports.startswith("export DATABASE_URL=") and DEMO_DATABASE in exports
    roles_line = _next_line(first_output, "Roles")
    made = int(re.search(r"DB_ROLES made (\d+) PostgreSQL roles", roles_line)[1])  # type: ignore[index]
    assert made == 3 * 3 + 2  # three tenants' three logins, and the two groups
    command = roles_line.rsplit("remove them with: ", 1)[1]
    python = command.split()[0]
    assert (ROOT / python).exists() or Path(python).exists(), python
    assert _next_line(first_output, "Real processes").startswith(f"{python} manage.py rqworker")
    env = {k: v for k, v in demo_env.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    try:
        done = subprocess.run(
            ["bash", "-c", f"{exports}; {command}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        # (another test of the module may have run the demo with a fourth tenant meanwhile)
        dropped = re.search(rf"dropped (\d+) role\(s\) of database '{DEMO_DATABASE}'", done.stdout)
        assert dropped and int(dropped[1]) >= made, done.stdout
    finally:
        back = subprocess.run(
            ["bash", "-c", f"{exports}; {python} manage.py kumiko_jobs roles"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert back.returncode == 0, back.stdout + back.stderr
