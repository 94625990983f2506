"""The German catalogue (kumiko_jobs/locale/de/LC_MESSAGES) is complete and compiled.

Three ways it goes wrong, each a test here: a string the code or a template marks for
translation never reaches the ``.po`` (``makemessages`` was not run); it reaches it untranslated
or ``fuzzy`` (makemessages' guess from a similar msgid, which Django does not use: the page shows
English); or the ``.po`` is translated but the committed ``.mo``, the file Django reads, was not
compiled again. The ``.mo`` is checked by content, compiled anew from the ``.po`` into a
temporary file and compared message by message: a checkout's file times say nothing about which
file was written last, and a byte comparison would fail on another gettext version's layout.

Regenerate and compile as the ``.po``'s header says (``makemessages -l de --no-location``, then
``compilemessages``), from kumiko_jobs/ with the venv's ``django-admin``.
"""

from __future__ import annotations

import ast
import gettext
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kumiko_jobs"
CATALOGUE = PACKAGE / "locale" / "de" / "LC_MESSAGES"
PO, MO = CATALOGUE / "django.po", CATALOGUE / "django.mo"

needs_gettext = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("msgfmt", "xgettext", "msgmerge")),
    reason="needs GNU gettext's tools (apt-get install gettext), as makemessages does",
)


@dataclass
class Entry:
    """One message of a ``.po`` file: its msgid (and plural), translations and flags."""

    msgid: str = ""
    plural: str | None = None
    msgstrs: list[str] = field(default_factory=list)
    flags: set[str] = field(default_factory=set)
    obsolete: bool = False


def _unquote(line: str) -> str:
    # A PO string is a C string literal; the escapes the catalogue uses (\" \\ \n) read the same
    # in Python.
    return str(ast.literal_eval(line))


def parse(text: str) -> list[Entry]:
    """The entries of a ``.po`` file, the header (msgid "") included."""
    entries: list[Entry] = []
    for block in text.split("\n\n"):
        entry, target = Entry(), None
        for raw in block.splitlines():
            line = raw.strip()
            if line.startswith("#~"):
                entry.obsolete = True
                line = line[2:].strip()
            if line.startswith("#,"):
                entry.flags |= {flag.strip() for flag in line[2:].split(",")}
                continue
            if not line or line.startswith("#"):
                continue
            keyword, _, rest = line.partition(" ")
            if line.startswith('"'):
                assert target is not None, f"a string continued before a keyword: {block!r}"
                keyword, rest = target, line
            value = _unquote(rest)
            if keyword == "msgid":
                entry.msgid += value
            elif keyword == "msgid_plural":
                entry.plural = (entry.plural or "") + value
            elif keyword == "msgstr" or keyword.startswith("msgstr["):
                index = 0 if keyword == "msgstr" else int(keyword[7:-1])
                if keyword != target:
                    entry.msgstrs.append("")
                assert len(entry.msgstrs) == index + 1, f"msgstr forms out of order: {block!r}"
                entry.msgstrs[index] += value
            else:
                raise AssertionError(f"unknown line {raw!r} in {PO}")
            target = keyword
        if target is not None:
            entries.append(entry)
    return entries


def messages(entries: list[Entry]) -> list[Entry]:
    """The translatable messages: no header, no obsolete (``#~``) entries."""
    return [e for e in entries if e.msgid and not e.obsolete]


def shown(entry: Entry) -> str:
    return repr(entry.msgid) if entry.plural is None else f"{entry.msgid!r} / {entry.plural!r}"


def test_the_parser_reads_the_catalogues_plurals_flags_and_continued_lines() -> None:
    """The reader the tests below rely on, on each form the catalogue uses."""
    (header, plural, wrapped, old) = parse(
        'msgid ""\nmsgstr ""\n"Language: de\\n"\n\n'
        '#, fuzzy, python-format\nmsgid "%(n)d run"\nmsgid_plural "%(n)d runs"\n'
        'msgstr[0] "%(n)d Lauf"\nmsgstr[1] ""\n\n'
        'msgid ""\n"Say \\"a\\" "\n"then b"\nmsgstr ""\n"Sag „a“ "\n"dann b"\n\n'
        '#~ msgid "gone"\n#~ msgstr "weg"'
    )
    assert header.msgid == "" and header.msgstrs == ["Language: de\n"]
    assert plural.plural == "%(n)d runs" and plural.msgstrs == ["%(n)d Lauf", ""]
    assert plural.flags == {"fuzzy", "python-format"}
    assert wrapped.msgid == 'Say "a" then b' and wrapped.msgstrs == ["Sag „a“ dann b"]
    assert old.obsolete and messages([header, plural, wrapped, old]) == [plural, wrapped]


def test_every_message_is_translated_and_none_is_fuzzy() -> None:
    entries = messages(parse(PO.read_text(encoding="utf-8")))
    assert len(entries) > 200  # the catalogue was read, not an empty file
    fuzzy = [shown(e) for e in entries if "fuzzy" in e.flags]
    untranslated = [shown(e) for e in entries if not e.msgstrs or not all(e.msgstrs)]
    forms = [shown(e) for e in entries if e.plural is not None and len(e.msgstrs) != 2]
    assert not fuzzy, f"fuzzy (Django ignores them; translate and drop the flag): {fuzzy}"
    assert not untranslated, f"untranslated in {PO.relative_to(ROOT)}: {untranslated}"
    assert not forms, f"German has two plural forms; these have other counts: {forms}"


def test_no_message_is_listed_twice() -> None:
    ids = [(e.msgid, e.plural) for e in messages(parse(PO.read_text(encoding="utf-8")))]
    assert len(ids) == len(set(ids))


def _catalogue(mo: Path) -> dict[object, str]:
    with mo.open("rb") as handle:
        translations = gettext.GNUTranslations(handle)
    return dict(translations._catalog)  # type: ignore[attr-defined]


@needs_gettext
def test_the_committed_mo_is_the_po_compiled(tmp_path: Path) -> None:
    fresh = tmp_path / "django.mo"
    # As compilemessages compiles (it runs msgfmt --check-format).
    subprocess.run(
        ["msgfmt", "--check-format", "-o", str(fresh), str(PO)],
        check=True,
        capture_output=True,
        text=True,
    )
    expected, committed = _catalogue(fresh), _catalogue(MO)
    stale = sorted(
        str(key)
        for key in expected.keys() | committed.keys()
        if expected.get(key) != committed.get(key)
    )
    assert not stale, (
        f"{MO.relative_to(ROOT)} is not {PO.name} compiled (run compilemessages); "
        f"these messages differ: {stale[:20]}"
    )


@needs_gettext
def test_the_catalogue_holds_every_message_the_code_and_templates_mark(tmp_path: Path) -> None:
    """``makemessages`` over a copy of the package: it adds what the sources mark and the
    ``.po`` lacks, and marks obsolete what the ``.po`` has and no source marks any more."""
    copy = tmp_path / "kumiko_jobs"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # Without the test settings: makemessages configures Django itself and reads the cwd only.
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "-m", "django", "makemessages", "-l", "de", "--no-location"],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    committed = parse(PO.read_text(encoding="utf-8"))
    regenerated = parse((copy / "locale/de/LC_MESSAGES/django.po").read_text(encoding="utf-8"))
    have = {(e.msgid, e.plural) for e in messages(committed)}
    marked = {(e.msgid, e.plural) for e in messages(regenerated)}
    missing, gone = sorted(marked - have, key=str), sorted(have - marked, key=str)
    assert not missing, (
        f"marked for translation in kumiko_jobs/ but missing from {PO.relative_to(ROOT)} "
        f"(run makemessages and translate): {missing}"
    )
    assert not gone, f"in {PO.relative_to(ROOT)} but no longer marked anywhere (drop): {gone}"
