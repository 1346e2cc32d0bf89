"""A skip means "this machine cannot run it" (issue 37): read from the test sources with ``ast``.

- No test catches ``Exception`` / ``BaseException`` or uses a bare ``except``: an error of the code
  under test must fail its test.
- A ``pytest.skip`` inside an ``except`` handler catches only what says the machine lacks something
  (a package: ``ImportError``; a model package: ``ModelUnavailable``; ggml's library:
  ``GgmlUnavailable``), and for ``ImportError`` the ``try`` body holds import statements only, so no
  code of ours has run when the skip is decided.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ALLOWED = {"ImportError", "ModuleNotFoundError", "ModelUnavailable", "GgmlUnavailable"}


def _names(node) -> set[str]:
    if node is None:
        return {"<bare>"}
    if isinstance(node, ast.Tuple):
        return set().union(*(_names(e) for e in node.elts))
    return {ast.unparse(node).rsplit(".", 1)[-1]}


def _skips(handler) -> bool:
    return any(isinstance(n, ast.Call) and ast.unparse(n.func) in ("pytest.skip", "skip")
               for n in ast.walk(handler))


def problems(source: str, name: str = "<test>") -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Try):
            continue
        for h in node.handlers:
            caught = _names(h.type)
            if caught & {"Exception", "BaseException", "<bare>"}:
                out.append(f"{name}:{h.lineno}: catches {', '.join(sorted(caught))}")
            elif _skips(h):
                if not caught <= ALLOWED:
                    out.append(f"{name}:{h.lineno}: skips on {', '.join(sorted(caught))}")
                elif caught & {"ImportError", "ModuleNotFoundError"} and \
                        not all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in node.body):
                    out.append(f"{name}:{h.lineno}: skips on ImportError around more than imports")
    return out


def test_no_skip_after_the_code_under_test_ran():
    found = [p for f in sorted(TESTS.glob("*.py")) if f.name != Path(__file__).name
             for p in problems(f.read_text(), f.name)]
    assert not found, "\n".join(found)


def test_the_check_sees_the_patterns_it_forbids():
    assert problems("try:\n    run()\nexcept RuntimeError as e:\n    pytest.skip(str(e))\n")
    assert problems("try:\n    run()\nexcept Exception:\n    pass\n")
    assert problems("try:\n    import x\n    x.go()\nexcept ImportError:\n    pytest.skip('no x')\n")
    assert not problems("try:\n    import x\nexcept ImportError:\n    pytest.skip('no x')\n")
    assert not problems("try:\n    p = model_path('g')\nexcept ModelUnavailable as e:\n    pytest.skip(str(e))\n")
