"""docs/architecture.md against the code: its data-flow picture, its module map and its "Where a change
goes" table.

The table is read from the page. In each row, every path in backticks must exist (``<name>`` and ``*``
stand for any part of a file name), every name in backticks must be defined in one of the files that
row names (a Python definition, class attribute or module-level name; a ``#define`` or function of a
kernel source; ``TQA_<NAME>`` as a pattern), and every ``tqbridge ...`` command must parse with the
subcommand's own arguments. The rows of a new format and a new command are also walked in-process: a
toy format registered the way ``bridge/blocks/registry.py`` registers a codec module's entries, a toy command
added to ``tools/cli.py``'s table, and the consequences the docs promise checked. The picture's modules
and commands must exist, every module of the mapped folders must be named on the page, and README's
layout block must name real folders and the packages of ``pyproject.toml``. Each checker of the page is
shown to fail on a planted stale copy of it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import re
import shlex
import sys
import types
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
FILE_EXT = (".py", ".h", ".cpp", ".c", ".md", ".json", ".toml")
IDENT = re.compile(r"[A-Za-z_]\w*(?:<\w+>\w*)?(?:\.[A-Za-z_]\w*)?(?:\(\.*\))?")


# ---- reading the page ----------------------------------------------------------------------------

def change_table(text: str) -> dict[str, str]:
    """The "Where a change goes" table: change -> the cell of places it touches."""
    section = text.partition("## Where a change goes")[2].partition("\n## ")[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 2 and cells[0] not in ("change", "---"):
            rows[cells[0]] = cells[1]
    return rows


def spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def _is_path(tok: str) -> bool:
    return "/" in tok or tok.endswith(FILE_EXT)


def _glob(tok: str) -> list[Path]:
    pattern = re.sub(r"<\w+>", "*", tok)
    if "*" in pattern:
        return sorted(ROOT.glob(pattern))
    p = ROOT / pattern
    return [p] if p.exists() else []


# ---- what a file defines -------------------------------------------------------------------------

def _py_defines(path: Path) -> set[str]:
    """Names a Python file defines: functions, classes, methods and class attributes (as ``Class.attr``
    too), module-level assignments."""
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()

    def targets(node) -> list[str]:
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        return []

    for node in tree.body:
        out.update(targets(node))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                names = targets(item) + ([item.name] if isinstance(item, (ast.FunctionDef, ast.ClassDef)) else [])
                out.update(names)
                out.update(f"{node.name}.{n}" for n in names)
    return out


def _defines(path: Path, name: str) -> bool:
    if "<" in name:     # a pattern such as TQA_<NAME>: some such word in the file
        rx = re.compile(r"\b" + re.sub(r"<\w+>", r"\\w+", name) + r"\b")
        return bool(rx.search(path.read_text()))
    if path.suffix == ".py":
        if name in _py_defines(path):
            return True
        head, _, tail = name.partition(".")
        return bool(tail) and head == path.stem and tail in _py_defines(path)
    if path.suffix in (".h", ".cpp", ".c"):
        text = path.read_text()
        return bool(re.search(rf"^\s*#define\s+{re.escape(name)}\b", text, re.M)
                    or re.search(rf"^TQ_FUNC\b[^\n(]*\b{re.escape(name)}\s*\(", text, re.M))
    return False


# ---- commands ------------------------------------------------------------------------------------

def command_problem(cmd: str) -> "str | None":
    """Why ``tqbridge SUB [WORD | --option [VALUE]] ...`` is not a command line the parser takes."""
    from tqbridge.tools.cli import COMMANDS

    words = shlex.split(cmd)[1:]
    if not words or words[0] not in COMMANDS:
        return f"`{cmd}`: no subcommand {words[:1]} in tools/cli.py's COMMANDS"
    parser = argparse.ArgumentParser(prog=f"tqbridge {words[0]}")
    importlib.import_module(f"tqbridge.tools.{COMMANDS[words[0]][0]}").add_arguments(parser)
    rest = words[1:]
    while rest:
        w = rest.pop(0)
        if w.startswith("-"):
            action = parser._option_string_actions.get(w.split("=")[0])
            if action is None:
                return f"`{cmd}`: no option {w} of {parser.prog}"
            if action.nargs != 0 and "=" not in w and rest:
                rest.pop(0)             # its value
            continue
        for action in parser._actions:
            if not action.option_strings and action.choices is not None and w in action.choices:
                if isinstance(action, argparse._SubParsersAction):
                    parser = action.choices[w]
                break
        else:
            return f"`{cmd}`: {parser.prog} takes no word {w!r}"
    return None


# ---- the checker ---------------------------------------------------------------------------------

def row_problems(cell: str) -> list[str]:
    """What is stale in one cell of the table."""
    out = []
    files: list[Path] = []
    names = []
    for tok in spans(cell):
        if tok.startswith("tqbridge "):
            why = command_problem(tok)
            if why:
                out.append(why)
        elif tok.startswith(("-", '"', "'")) or tok[:1].isdigit():
            continue                    # an option, a string or a value
        elif _is_path(tok):
            found = _glob(tok)
            if not found:
                out.append(f"`{tok}`: no such path")
            files += [p for p in found if p.is_file()]
        elif IDENT.fullmatch(tok):
            names.append(re.sub(r"\(\.*\)$", "", tok))
        else:
            out.append(f"`{tok}`: neither a path, a name nor a tqbridge command")
    for name in names:
        if not any(_defines(p, name) for p in files):
            out.append(f"`{name}`: defined in none of the files its row names "
                       f"({', '.join(str(p.relative_to(ROOT)) for p in files) or 'none'})")
    return out


def table_problems(text: str) -> dict[str, list[str]]:
    rows = change_table(text)
    if not rows:
        return {"(table)": ["no 'Where a change goes' table"]}
    return {change: bad for change, cell in rows.items() if (bad := row_problems(cell))}


def picture_problems(text: str) -> list[str]:
    """The data-flow picture (the indented block before the first section): every folder/module it
    names exists, every ``tqbridge X`` is a subcommand."""
    from tqbridge.tools.cli import COMMANDS

    picture = text.partition("\n## ")[0]
    block = "\n".join(line for line in picture.splitlines() if line.startswith("    "))
    out = []
    for ref in re.findall(r"\b(?:bridge|metal|parity|tools)/[\w/]+", block):
        if not ((ROOT / ref).is_dir() or (ROOT / f"{ref}.py").is_file()):
            out.append(f"picture: {ref} is neither a folder nor a module")
    out += [f"picture: tqbridge {c} is no subcommand" for c in re.findall(r"tqbridge (\w+)", block) if c not in COMMANDS]
    return out if block else ["no data-flow picture"]


# the folders whose modules the page names one by one (parity/plugin/ has its own page, docs/plugin.md)
MAPPED = ("bridge", "bridge/blocks", "bridge/gguf", "bridge/llama", "metal", "metal/attention", "metal/lm", "parity", "parity/harness", "tools")


def unnamed_modules(text: str) -> list[str]:
    named = set()
    patterns = []
    for tok in spans(text):
        base = tok.rsplit("/", 1)[-1]
        if "*" in base or "<" in base:   # cmd_<name>.py, level_*.py: any word in that place
            parts = re.split(r"(\*|<\w+>)", base)
            patterns.append(re.compile("".join(r"\w+" if i % 2 else re.escape(x) for i, x in enumerate(parts)) + "$"))
        named.add(base if base.endswith(".py") else base + ".py")
    out = []
    for folder in MAPPED:
        for p in sorted((ROOT / folder).glob("*.py")):
            if p.name != "__init__.py" and p.name not in named and not any(rx.match(p.name) for rx in patterns):
                out.append(f"{p.relative_to(ROOT)}")
    return out


# ---- the page as it is ---------------------------------------------------------------------------

TEXT = DOC.read_text()


def test_the_table_has_the_four_walked_changes():
    rows = change_table(TEXT)
    assert {"a new block format", "a new kernel variant", "a new parity level", "a new CLI command"} <= set(rows)


def test_every_path_name_and_command_of_the_table_exists():
    assert table_problems(TEXT) == {}


def test_the_data_flow_picture_names_real_modules():
    assert picture_problems(TEXT) == []


def test_every_module_is_named_on_the_page():
    assert unnamed_modules(TEXT) == []


def test_readme_layout_folders_are_the_packages():
    readme = (ROOT / "README.md").read_text().partition("## Layout")[2].partition("\n## ")[0]
    pyproject = (ROOT / "pyproject.toml").read_text()
    block = [line for line in readme.splitlines() if line.startswith("    ")]
    rows = re.findall(r"^    (\w+)/\s+(tqbridge\.\w+)?", "\n".join(block), re.M)
    assert {"bridge", "metal", "parity", "tools", "tests", "benchmarks", "docs"} <= {folder for folder, _ in rows}
    for folder, package in rows:
        assert (ROOT / folder).is_dir(), folder
        if package:
            assert f'"{package}" = "{folder}"' in pyproject, (package, folder)
    # the sub-folders each folder's description names (kernels/, lm/, harness/, records/, ...)
    folder, subs = None, 0
    for line in block:
        m = re.match(r"    (\w+)/", line)
        folder = m.group(1) if m else folder
        for sub in re.findall(r"(?<![\w/<])([a-z_]+)/(?=[\s(,<])", line[14:]):
            assert (ROOT / folder / sub).is_dir(), f"{folder}/{sub}"
            subs += 1
    assert subs >= 6


# ---- the checkers fail on a stale page -----------------------------------------------------------

@pytest.mark.parametrize("old, new, expect", [
    # a module split or renamed: the path is gone
    ("`metal/attention/plan.py`", "`metal/attention_kernel_plan.py`", "no such path"),
    # a function renamed: the row's files no longer define it
    ("`make_plan`", "`make_v1_plan`", "defined in none of the files"),
    # a name left behind in a file the row no longer names
    ("`_ensure_loaded` in `bridge/blocks/registry.py`", "`_ensure_loaded` in `bridge/blocks/turbo.py`", "defined in none of the files"),
    # a kernel-source pattern that no header has
    ("`TQA_<NAME>` and its branch", "`TQAV1_<NAME>` and its branch", "defined in none of the files"),
    # a subcommand or an action that the parser does not take
    ("`tqbridge records add`", "`tqbridge records file`", "takes no word 'file'"),
    ("`tqbridge bench attention --variants 'field=value;'`", "`tqbridge bench attention --variant-list x`",
     "no option --variant-list"),
    ("`tqbridge records index`", "`tqbridge index`", "no subcommand"),
])
def test_a_planted_stale_table_is_caught(old, new, expect):
    assert old in TEXT, old           # the plant edits text that is on the page
    found = table_problems(TEXT.replace(old, new, 1))
    assert any(expect in msg for msgs in found.values() for msg in msgs), found


def test_a_planted_stale_picture_and_an_unnamed_module_are_caught():
    assert "metal/quantize_append" in TEXT
    assert any("metal/quantize_blocks" in m for m in picture_problems(TEXT.replace("metal/quantize_append", "metal/quantize_blocks", 1)))
    assert any("tqbridge bench2" in m for m in picture_problems(TEXT.replace("tqbridge demo", "tqbridge bench2", 1)))
    assert "bridge/blocks/padding.py" in unnamed_modules(TEXT.replace("`padding.py`", "padding"))


# ---- walk: a new block format ----------------------------------------------------------------------

def _format_modules() -> set[str]:
    """The bridge modules that list registry entries (a module-level ``FORMATS``)."""
    return {p.stem for p in (ROOT / "bridge" / "blocks").glob("*.py") if "FORMATS" in _py_defines(p)}


def _registered_modules(registry_source: str) -> set[str]:
    """The modules ``_ensure_loaded`` imports and registers (``from . import a, b``)."""
    fn = next(n for n in ast.walk(ast.parse(registry_source)) if isinstance(n, ast.FunctionDef) and n.name == "_ensure_loaded")
    return {a.name for n in ast.walk(fn) if isinstance(n, ast.ImportFrom) and n.level == 1 for a in n.names}


def test_every_module_with_formats_is_registered_where_the_table_says():
    # the table: "a new family is its own module in bridge/, imported and registered by _ensure_loaded"
    source = (ROOT / "bridge" / "blocks" / "registry.py").read_text()
    assert _format_modules() == _registered_modules(source)
    # planted: a loader that imports one family only misses the others
    stale = "def _ensure_loaded():\n    from . import formats_ggml\n"
    assert _registered_modules(stale) == {"formats_ggml"} and "turbo" in _format_modules() - _registered_modules(stale)


class _ToyCodec:
    """q8-like toy: one float16 scale, 32 int8 codes."""

    @staticmethod
    def quantize_blocks(x):
        d = np.abs(x).max(axis=1, keepdims=True) / 127
        q = np.round(np.divide(x, d, out=np.zeros_like(x), where=d > 0)).astype(np.int8)
        return np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=1)

    @staticmethod
    def dequantize_blocks(b):
        return b[:, :2].copy().view(np.float16).astype(np.float32) * b[:, 2:].view(np.int8).astype(np.float32)


@pytest.fixture
def toy_format(monkeypatch):
    """A toy entry registered as ``_ensure_loaded`` registers a codec module's ``FORMATS``, in copies of
    the registry's tables (restored after the test)."""
    from tqbridge.bridge.blocks import registry
    from tqbridge.bridge.blocks.format_types import Format

    registry.all_formats()
    for table in ("_FORMATS", "_DEFAULT_VARIANT", "_ORDER"):
        monkeypatch.setattr(registry, table, type(getattr(registry, table))(getattr(registry, table)))
    fmt = Format(name="walk_toy", variant=None, kind="ggml", block_size=32, type_size=34, codec=_ToyCodec,
                 description="toy", extension=True, kernel_id=max(registry.kernel_ids().values()) + 1)
    registry.register(fmt)
    return fmt


def test_walk_a_new_format(toy_format, capsys):
    from hypothesis import find

    from tqbridge import bridge
    from tqbridge.bridge.blocks.registry import kernel_ids
    from tqbridge.metal.quantize_append import supported
    from tqbridge.parity.plugin.strategies_blocks import format_names
    from tqbridge.tools.cli import main
    from helpers_kernels import c_ids

    # adding-a-format.md, "what then follows": the name resolves, the codec runs, `tqbridge formats` lists it
    assert bridge.get_format("WALK_TOY") is toy_format and "walk_toy" in bridge.formats()
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
    assert np.abs(bridge.dequantize("walk_toy", bridge.quantize("walk_toy", x), 64) - x).max() < 1e-2
    assert main(["formats"]) == 0 and "walk_toy" in capsys.readouterr().out
    # the derived tables take it: the kernels' ids, the append kernel's formats (so tests/test_append.py
    # runs it), the plugin's format strategy
    assert kernel_ids()["walk_toy"] == toy_format.kernel_id and supported("walk_toy")
    assert find(format_names(), lambda k: k == "walk_toy") == "walk_toy"
    # and the checks the table names fail until the places it names are edited: the headers lack its
    # TQA_ / QA_ ids (tests/test_registry.py), docs/formats-ggml.md's format table lacks its row (test_doc_claims)
    tqa, qa = c_ids("attention_kernel.h", "TQA_"), c_ids("quantize_append.h", "QA_")
    assert "WALK_TOY" not in tqa and "WALK_TOY" not in qa
    import test_doc_claims

    with pytest.raises(AssertionError, match="walk_toy"):
        test_doc_claims.test_formats_table_is_the_registry()


def test_the_registry_is_itself_again_after_the_walk():
    from tqbridge import bridge

    assert "walk_toy" not in bridge.formats()


# ---- walk: a new CLI command ---------------------------------------------------------------------

def test_every_command_is_one_module_with_its_two_functions():
    from tqbridge.tools.cli import COMMANDS

    modules = {m for m, _ in COMMANDS.values()}
    assert modules == {p.stem for p in (ROOT / "tools").glob("cmd_*.py")}
    for m in modules:
        assert {"add_arguments", "run"} <= _py_defines(ROOT / "tools" / f"{m}.py"), m


def test_walk_a_new_cli_command(monkeypatch, capsys):
    from tqbridge.tools import cli

    toy = types.ModuleType("tqbridge.tools.cmd_walk_toy")

    def add_arguments(p):
        p.add_argument("--n", type=int, default=1)

    def run(args):
        if args.n < 0:
            raise cli.CliError("--n must not be negative")
        print("walked" * args.n)
        return 3

    toy.add_arguments, toy.run = add_arguments, run
    monkeypatch.setitem(sys.modules, toy.__name__, toy)
    monkeypatch.setitem(cli.COMMANDS, "walk-toy", ("cmd_walk_toy", "a toy command"))
    # the one line in COMMANDS is all it takes: the help lists it, it runs with its arguments, its exit
    # code and its CliError come back as the table says
    assert cli.main([]) == 0 and "a toy command" in capsys.readouterr().out
    assert cli.main(["walk-toy", "--n", "2"]) == 3 and capsys.readouterr().out == "walkedwalked\n"
    assert cli.main(["walk-toy", "--n", "-1"]) == 2
    assert capsys.readouterr().err.strip() == "tqbridge walk-toy: error: --n must not be negative"
    assert command_problem("tqbridge walk-toy --n 2") is None
    assert command_problem("tqbridge walk-toy --m 2") is not None


# ---- the level and variant rows: their mechanics -------------------------------------------------

def test_every_level_module_is_a_level_of_the_command():
    from tqbridge.parity.harness.run_levels import LEVELS

    source = (ROOT / "parity" / "harness" / "run_levels.py").read_text()
    modules = [p.stem for p in (ROOT / "parity" / "harness").glob("level_*.py")]
    assert modules
    for m in modules:
        assert m.removeprefix("level_") in LEVELS and f"tqbridge.parity.harness.{m} import" in source, m
    for level in LEVELS:
        assert any((ROOT / "parity" / "harness" / f"{n}.py").exists() for n in (f"level_{level}", level)), level


def test_a_levels_verdict_follows_from_passed(monkeypatch):
    # the table: "the verdict line, the exit code and the JSON report follow from "passed""
    from tqbridge.parity.harness import run_levels

    monkeypatch.setattr(run_levels, "LEVELS", run_levels.LEVELS + ("walk_toy",))
    assert run_levels.parse_levels("walk_toy") == ["walk_toy"]
    verdicts = run_levels.level_verdicts(["walk_toy"], {"walk_toy": {"passed": False}}, None)
    assert verdicts == [{"level": "walk_toy", "passed": False}]
    assert run_levels.verdict_line(verdicts) == "a parity claim FAILED: walk_toy"


def test_the_builder_sees_the_plan_and_the_planner_the_options():
    # the table: a variant is read by make_plan and carried on the Plan to static_params
    import inspect

    from tqbridge.metal.attention import build as attention_build
    from tqbridge.metal.attention import plan as attention_plan
    from tqbridge.metal.decode_options import BOOL_FIELDS, DecodeOptions

    assert "options" in inspect.signature(attention_plan.make_plan).parameters
    assert list(inspect.signature(attention_build.static_params).parameters)[:2] == ["prob", "plan"]
    assert dataclasses.is_dataclass(attention_plan.Plan)
    fields = {f.name: f for f in dataclasses.fields(DecodeOptions)}
    assert all(n in fields for n in BOOL_FIELDS)
    assert DecodeOptions.parse("dynamic_shared=1") == DecodeOptions(dynamic_shared=True)


# ---- walk: the decode step ------------------------------------------------------------------------

def _decode_step_picture() -> "list[str]":
    """The ``Class.method`` / function names of the page's decode-step picture, in order."""
    block = TEXT.split("## The decode step: one path", 1)[1].split("\n\n", 2)[1]
    return re.findall(r"\b(?:TQCache|LayerDecoder)\.\w+|\bprepare_decode\b|\bDecodeLaunch\b", block)


def test_the_decode_step_runs_the_path_the_page_draws(monkeypatch):
    """A routed decode on the emulated GPU lane calls what the picture names, in its order: the first
    step prepares (append_in_place, attend_fused -> prepare_decode), later steps take the prepared
    append_step and attend_step and nothing else."""
    mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
    pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")
    from tiny_models import tiny_llama, tokens

    from tqbridge.metal.attention import kernel as attention_kernel
    from tqbridge.metal.backend import emulate_decode_lane
    from tqbridge.metal.attention import decoder as decoder_mod
    from tqbridge.metal.lm.cache import TQCache, make_cache
    from tqbridge.metal.lm.routing import route_attention

    names = _decode_step_picture()
    assert names[:2] == ["TQCache.update_and_fetch", "LayerDecoder.append_step"], names
    calls: list = []

    def spy(owner, name, label):
        real = getattr(owner, name)

        def wrapped(*a, **k):
            calls.append(label)
            return real(*a, **k)
        monkeypatch.setattr(owner, name, wrapped)

    for n in names:
        if "." in n:
            cls, meth = n.split(".")
            spy(TQCache if cls == "TQCache" else decoder_mod.LayerDecoder, meth, n)
    spy(attention_kernel, "prepare_decode", "prepare_decode")
    prev = mx.default_device()
    mx.set_default_device(mx.cpu)
    try:
        m = tiny_llama()
        cache = make_cache(m, "q8_0", "q8_0")
        with emulate_decode_lane(), route_attention():
            mx.eval(m(tokens(8), cache=cache))
            steps = []
            for i in range(3):
                calls.clear()
                mx.eval(m(tokens(1, seed=i), cache=cache))
                steps.append([c for c in calls])
    finally:
        mx.set_default_device(prev)
    layer = len(steps[0]) // 2
    first = steps[0][:layer]
    assert first == ["TQCache.update_and_fetch", "LayerDecoder.append_step", "LayerDecoder.append_in_place",
                     "TQCache.attend", "LayerDecoder.attend_step", "LayerDecoder.attend_fused", "prepare_decode"], first
    for later in steps[1:]:
        assert later == ["TQCache.update_and_fetch", "LayerDecoder.append_step", "TQCache.attend",
                         "LayerDecoder.attend_step"] * 2, later
    # LayerDecoder.write: the MLX-ops append, off the GPU lane (prompt chunks on a CPU)
    assert set(names) <= {c for s in steps for c in s} | {"DecodeLaunch", "LayerDecoder.write"}, names
