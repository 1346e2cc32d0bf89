"""Private names stay home (issue 47): a name with one leading underscore is its module's own, so no
other module imports it (``from X import _name``, ``from . import _module``, ``import x._module``). A helper
two modules need is public in one of them; a helper test files share lives in a ``tests/helpers_*.py``
module. Read from every ``.py`` file of the repository with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_DIRS = {"tqbridge.egg-info", "__pycache__", "build", "dist", "node_modules"}   # and every hidden folder
# What remains, one per imported name, 2 of third-party packages where they have no public way (a comment
# at each says why):
#   mlx_lm.utils._get_classes (bridge/gguf/model.py), llama_cpp._logger.set_verbose (bridge/llama/capture.py).
MAX_PRIVATE_IMPORTS = 2


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(source: str, name: str = "<source>") -> list[str]:
    """``name:line: statement`` for each private name one module's source imports from another."""
    out = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.ImportFrom):
            where = "." * node.level + (node.module or "")
            for a in node.names:
                if _private(a.name) or any(_private(p) for p in (node.module or "").split(".")):
                    out.append(f"{name}:{node.lineno}: from {where} import {a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if any(_private(p) for p in a.name.split(".")):
                    out.append(f"{name}:{node.lineno}: import {a.name}")
    return out


def python_files() -> list[Path]:
    return [p for p in sorted(ROOT.rglob("*.py"))
            if not any(part.startswith(".") or part in SKIPPED_DIRS for part in p.relative_to(ROOT).parts[:-1])]


def test_few_private_names_cross_a_module_boundary():
    found = [hit for p in python_files() for hit in private_imports(p.read_text(), p.relative_to(ROOT).as_posix())]
    listed = "\n".join(found)
    print(f"{len(found)} private imports across modules (at most {MAX_PRIVATE_IMPORTS}):\n{listed}")
    assert len(found) <= MAX_PRIVATE_IMPORTS, (
        f"{len(found)} private imports across modules, more than {MAX_PRIVATE_IMPORTS}: make the helper public "
        f"in one module (tests: a tests/helpers_*.py module):\n{listed}")


def test_the_count_sees_every_spelling():
    planted = ("from .codecs import _quantizer, dequantize\n"
               "from tqbridge.bridge import _private_module\n"
               "from ._hidden import thing\n"
               "import pkg._inner\n"
               "def f():\n    from mlx_lm.utils import _get_classes\n")
    assert [h.split(": ", 1)[1] for h in private_imports(planted)] == [
        "from .codecs import _quantizer", "from tqbridge.bridge import _private_module", "from ._hidden import thing",
        "import pkg._inner", "from mlx_lm.utils import _get_classes"]
    clean = "from __future__ import annotations\nfrom .codecs import dequantize\nimport os.path\nfrom . import __version__\n"
    assert private_imports(clean) == []


def test_the_walk_reads_the_folders_that_hold_code():
    tops = {p.relative_to(ROOT).parts[0] for p in python_files()}
    assert {"bridge", "metal", "parity", "tools", "tests", "benchmarks"} <= tops, tops
    assert not any(".venv" in p.parts for p in python_files())
