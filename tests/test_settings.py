"""The environment variables library code reads are the ones docs/settings.md lists (issue 34):
user settings in its first table (at most 8), the kernel switches not yet turned into options in the
second. Read from the source with ``ast``: a string constant that is a whole ``TQBRIDGE_*`` name."""

from __future__ import annotations

import ast
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


def documented() -> tuple[set[str], set[str]]:
    """(user settings, kernel switches): the names in the first column of each table."""
    text = (ROOT / "docs" / "settings.md").read_text()
    user, _, rest = text.partition("## Kernel switches")
    first = lambda part: {m for line in part.splitlines() if line.startswith("| `")      # noqa: E731
                          for m in NAME.findall(line.split("|")[1])}
    return first(user), first(rest)


def test_every_variable_the_code_reads_is_documented_and_nothing_more():
    user, kernel = documented()
    code = names_in_code()
    assert not user & kernel
    assert set(code) == user | kernel, {"undocumented": sorted(set(code) - user - kernel),
                                        "documented but not read": sorted((user | kernel) - set(code))}


def test_user_settings_are_few_and_kernel_switches_live_in_the_planner_only():
    user, kernel = documented()
    assert len(user) <= MAX_USER_SETTINGS, sorted(user)
    code = names_in_code()
    assert all(code[k] == {"metal/attention_kernel.py"} for k in kernel), {k: code[k] for k in kernel}


def test_the_check_sees_an_undocumented_read(tmp_path):
    # the verdict can fail: a tree with one module that reads a new variable
    (tmp_path / "bridge").mkdir()
    (tmp_path / "bridge" / "m.py").write_text('import os\nX = os.environ.get("TQBRIDGE_SOMETHING_NEW")\n')
    user, kernel = documented()
    assert set(names_in_code(tmp_path)) - user - kernel == {"TQBRIDGE_SOMETHING_NEW"}
