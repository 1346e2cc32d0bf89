"""A skip means "this machine cannot run it" (issue 37): read from the test sources with ``ast``.

- No test catches ``Exception`` / ``BaseException`` or uses a bare ``except``, nor wraps code in
  ``contextlib.suppress`` of those: an error of the code under test must fail its test.
- No test calls the builtin ``hash()``: a str's hash varies per process (PYTHONHASHSEED is not
  fixed), so a seed drawn from it makes a run unrepeatable; ``zlib.crc32`` of the name is the same.
- No ``except`` handler does nothing (``pass`` or ``...`` alone), whatever it catches: a swallowed
  error passes silently.
- A ``pytest.skip`` inside an ``except`` handler catches only what says the machine lacks something
  (a package: ``ImportError``; a model package: ``ModelUnavailable``; ggml's library:
  ``GgmlUnavailable``), and the ``try`` body runs no code of ours: for ``ImportError`` it holds import
  statements only; for the others it calls only the functions that find a model or load ggml
  (``LOCATORS``).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ALLOWED = {"ImportError", "ModuleNotFoundError", "ModelUnavailable", "GgmlUnavailable"}
BROAD = {"Exception", "BaseException", "<bare>"}
# what a try body may call before a skip on ModelUnavailable / GgmlUnavailable: finding a model (and
# its float32 copy) or loading ggml; ``fn`` is the argument of the tests' ``_model(fn)`` helpers,
# which callers pass one of these
LOCATORS = {"model_path", "smollm2_path", "gemma3_path", "cached_f32_gguf", "str", "ggml_c.load", "fn"}


def _names(node) -> set[str]:
    if node is None:
        return {"<bare>"}
    if isinstance(node, ast.Tuple):
        return set().union(*(_names(e) for e in node.elts))
    return {ast.unparse(node).rsplit(".", 1)[-1]}


def _skips(handler) -> bool:
    return any(isinstance(n, ast.Call) and ast.unparse(n.func) in ("pytest.skip", "skip")
               for n in ast.walk(handler))


def _does_nothing(handler) -> bool:
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
               for s in handler.body)


def _calls(stmts) -> set[str]:
    return {ast.unparse(n.func) for s in stmts for n in ast.walk(s) if isinstance(n, ast.Call)}


def problems(source: str, name: str = "<test>") -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                e = item.context_expr
                if isinstance(e, ast.Call) and ast.unparse(e.func).rsplit(".", 1)[-1] == "suppress":
                    caught = set().union(set(), *(_names(a) for a in e.args))
                    if caught & BROAD:
                        out.append(f"{name}:{node.lineno}: suppresses {', '.join(sorted(caught))}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hash":
            out.append(f"{name}:{node.lineno}: calls hash(), which varies per process")
        if not isinstance(node, ast.Try):
            continue
        for h in node.handlers:
            caught = _names(h.type)
            if caught & BROAD:
                out.append(f"{name}:{h.lineno}: catches {', '.join(sorted(caught))}")
            elif _does_nothing(h):
                out.append(f"{name}:{h.lineno}: swallows {', '.join(sorted(caught))} (the handler does nothing)")
            elif _skips(h):
                if not caught <= ALLOWED:
                    out.append(f"{name}:{h.lineno}: skips on {', '.join(sorted(caught))}")
                elif caught & {"ImportError", "ModuleNotFoundError"}:
                    if not all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in node.body):
                        out.append(f"{name}:{h.lineno}: skips on ImportError around more than imports")
                elif _calls(node.body) - LOCATORS:
                    out.append(f"{name}:{h.lineno}: skips on {', '.join(sorted(caught))} after calling "
                               f"{', '.join(sorted(_calls(node.body) - LOCATORS))}")
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
    # the code under test ran inside the try body of a ModelUnavailable skip
    assert problems("try:\n    p = model_path('g')\n    run(p)\nexcept ModelUnavailable as e:\n"
                    "    pytest.skip(str(e))\n") == ["<test>:4: skips on ModelUnavailable after calling run"]
    # an error suppressed by a context manager
    assert problems("with contextlib.suppress(Exception):\n    run()\n") == ["<test>:1: suppresses Exception"]
    assert problems("with suppress(ValueError, BaseException):\n    run()\n")
    # a handler of a tuple that does nothing
    assert problems("try:\n    run()\nexcept (ValueError, KeyError):\n    pass\n") == \
        ["<test>:3: swallows KeyError, ValueError (the handler does nothing)"]
    # a seed from hash() of a name
    assert problems("rng = np.random.default_rng(hash(kf) % 2**32)\n") == \
        ["<test>:1: calls hash(), which varies per process"]
    assert not problems("rng = np.random.default_rng(zlib.crc32(kf.encode()))\n")
    assert not problems("for k in ks:\n    try:\n        run(k)\n    except ValueError:\n        continue\n")
