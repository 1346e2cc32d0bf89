"""The environment variables library code reads are exactly the user settings docs/settings.md lists
(issue 34): at most 8, no kernel switch (those travel as DecodeOptions values). Read from the source
with ``ast``: a string constant that is a whole ``TQBRIDGE_*`` name."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"TQBRIDGE_[A-Z][A-Z0-9_]*")
MAX_USER_SETTINGS = 8      # issue 34's target


def names_in_code(root: Path = ROOT) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for top in ("bridge", "metal", "parity", "tools"):
        for p in (root / top).rglob("*.py"):
            for n in ast.walk(ast.parse(p.read_text(), str(p))):
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and NAME.fullmatch(n.value):
                    found.setdefault(n.value, set()).add(str(p.relative_to(root)))
    return found


def documented() -> set[str]:
    """The user settings: the names in the first column of the page's first table."""
    text = (ROOT / "docs" / "settings.md").read_text()
    user = text.partition("## Decode options")[0]
    return {m for line in user.splitlines() if line.startswith("| `") for m in NAME.findall(line.split("|")[1])}


def test_every_variable_the_code_reads_is_documented_and_nothing_more():
    user = documented()
    code = names_in_code()
    assert set(code) == user, {"undocumented": sorted(set(code) - user), "documented but not read": sorted(user - set(code))}
    assert len(user) <= MAX_USER_SETTINGS, sorted(user)


def test_the_decode_options_table_lists_every_field():
    from tqbridge.metal.decode_options import DecodeOptions

    text = (ROOT / "docs" / "settings.md").read_text().partition("## Decode options")[2]
    rows = [line.split("|")[1].strip().strip("`") for line in text.splitlines() if line.startswith("| `")]
    assert rows == [f.name for f in dataclasses.fields(DecodeOptions)]


def test_the_check_sees_an_undocumented_read(tmp_path):
    # the verdict can fail: a tree with one module that reads a new variable
    (tmp_path / "bridge").mkdir()
    (tmp_path / "bridge" / "m.py").write_text('import os\nX = os.environ.get("TQBRIDGE_SOMETHING_NEW")\n')
    assert set(names_in_code(tmp_path)) - documented() == {"TQBRIDGE_SOMETHING_NEW"}
