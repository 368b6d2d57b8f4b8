"""Every user-visible string has its zh-Hans translation.

`makemessages -l zh_Hans` runs on a copy of the sources (so the checked-in .po file
is never rewritten by a test) and must find nothing new: no entry without a
translation and no fuzzy one (msgmerge's guess from a similar string, which Django
ignores). Needs GNU gettext (`xgettext`, `msgmerge`), as `makemessages` does.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import polib
import pytest

ROOT = Path(__file__).resolve().parents[2]
PO = Path("locale/zh_Hans/LC_MESSAGES/django.po")
SOURCES = ("idempotency", "ledger", "orders", "payments", "templates", "locale")


def untranslated(po: polib.POFile) -> list[str]:
    return [
        entry.msgid
        for entry in po
        if not entry.obsolete and (not entry.translated() or entry.fuzzy)
    ]


@pytest.mark.skipif(shutil.which("xgettext") is None, reason="needs GNU gettext")
def test_makemessages_finds_nothing_untranslated(tmp_path):
    for name in SOURCES:
        shutil.copytree(
            ROOT / name,
            tmp_path / name,
            ignore=shutil.ignore_patterns("__pycache__", "migrations"),
        )
    shutil.copy(ROOT / "manage.py", tmp_path / "manage.py")
    before = (ROOT / PO).read_bytes()
    subprocess.run(
        [sys.executable, "manage.py", "makemessages", "-l", "zh_Hans", "--no-wrap"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert (ROOT / PO).read_bytes() == before  # the copy's file was rewritten
    missing = untranslated(polib.pofile(str(tmp_path / PO)))
    assert not missing, f"{len(missing)} strings need a zh-Hans translation: {missing}"


def test_the_checked_in_catalogue_is_complete_and_compiled():
    po = polib.pofile(str(ROOT / PO))
    assert not untranslated(po)
    mo = polib.mofile(str(ROOT / PO.with_suffix(".mo")))
    assert {e.msgid for e in po if not e.obsolete} <= {e.msgid for e in mo} | {""}
