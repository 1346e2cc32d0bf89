"""The pass-1 kernels' names (``lanes``, ``tiles``, ``int8-mma``: attention_problem.KERNELS). A former
name (``v1``, ``v2``, ``v3``, kept only in docs/kernel-history.md's table) is an unknown kernel like any
other: a one-line AttentionError (Python) or CliError (the CLI) listing the current names; the library
never spells a former name; committed benchmark records, which keep the names of their day, each name a
current kernel or one the history table maps."""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest

from tqbridge import bridge
from tqbridge.metal.attention import plan as attention_plan
from tqbridge.metal.attention import check_problem, decode_attention
from tqbridge.metal.attention.bench import kernel_configs
from tqbridge.metal.attention.problem import KERNELS, AttentionError, kernel_name

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("bridge", "metal", "parity", "tools")
LISTED = "choose one of lanes, tiles, int8-mma"


def _history_table() -> dict:
    """former -> current name, from the table of docs/kernel-history.md."""
    text = (ROOT / "docs" / "kernel-history.md").read_text()
    return dict(re.findall(r"^\| `(v[0-9])` \| `([a-z0-9-]+)` \|", text, re.M))


FORMER = sorted(_history_table())


def _case(rows: int = 4, length: int = 40):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, rows, 128)).astype(np.float32)
    kb = bridge.quantize("q8_0", rng.standard_normal((1, 1, length, 128)))
    vb = bridge.quantize("q4_0", rng.standard_normal((1, 1, length, 128)))
    return q, kb, vb, dict(k_format="q8_0", v_format="q4_0", length=length)


def test_the_names():
    assert KERNELS == ("lanes", "tiles", "int8-mma")
    assert _history_table() == {"v1": "lanes", "v2": "tiles", "v3": "int8-mma"}
    for name in KERNELS:   # usable on a command line and inside a comma-separated --kernel / --tune list
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name), name
        assert kernel_name(name) == name
    assert kernel_name(None) is None


@pytest.mark.parametrize("bad", FORMER + ["v4", "V2", "fast", "lanes ", ""])
def test_an_unknown_or_former_name_lists_the_valid_ones(bad):
    q, kb, vb, kw = _case()
    prob = check_problem(q, kb, vb, **kw)
    says = re.escape(f"unknown kernel {bad!r}; {LISTED}") + "$"
    for call in (lambda: kernel_name(bad),
                 lambda: attention_plan.make_plan(prob, "cuda", kernel=bad),
                 lambda: attention_plan.resolve_kernel(prob, "cuda", bad, "exact"),
                 lambda: decode_attention(q, kb, vb, backend="cpu-emulator", kernel=bad, **kw),
                 lambda: decode_attention(q, kb, vb, backend="reference", kernel=bad, **kw)):
        with pytest.raises(AttentionError, match=says) as e:
            call()
        assert "\n" not in str(e.value)


def test_bench_configs_carry_the_current_names():
    configs = kernel_configs("auto,tiles,int8-mma,lanes", "tiles:8x64,int8-mma:2x64,lanes:16x4x64,16x4")
    assert [c[0] for c in configs] == ["fused", "fused_tiles", "fused_int8-mma", "fused_lanes", "fused_tiles_8x64",
                                       "fused_int8-mma_2x64", "fused_lanes_16x4x64", "fused_lanes_16x4"]
    assert [c[1] for c in configs] == [None, "tiles", "int8-mma", "lanes", "tiles", "int8-mma", "lanes", "lanes"]


@pytest.mark.parametrize("kernel, tune, says", [
    ("auto,v9", "", "--kernel: unknown kernel 'v9'; choose from auto, lanes, tiles, int8-mma"),
    ("auto,v2", "", "--kernel: unknown kernel 'v2'; choose from auto, lanes, tiles, int8-mma"),
    ("", "", "--kernel: name at least one kernel"),
    ("auto", "v9:8x64", "--tune: 'v9:8x64' is not tiles:WARPSxTILE, int8-mma:WARPSxTILE[xCHUNKS] or lanes:LPKxWARPS[xTILE]"),
    ("auto", "v2:8x64", "--tune: 'v2:8x64' is not tiles:WARPSxTILE"),
    ("auto", "tiles:8x64x2", "is not tiles:WARPSxTILE"),
    ("auto", "int8-mma:4x64x1x2", "is not tiles:WARPSxTILE"),
])
def test_bench_refuses_unknown_kernels_naming_the_valid_ones(kernel, tune, says):
    with pytest.raises(AttentionError, match=re.escape(says)):
        kernel_configs(kernel, tune)


def test_bench_refuses_a_former_name_in_one_line(capsys):
    from tqbridge.tools.cli import main

    assert main(["bench", "attention", "--backend", "cpu-emulator", "--kernel", "auto,v2"]) != 0
    err = capsys.readouterr().err.strip()
    assert err.endswith("--kernel: unknown kernel 'v2'; choose from auto, lanes, tiles, int8-mma"), err
    assert "\n" not in err and "Traceback" not in err


def test_bench_defaults_name_current_kernels():
    from tqbridge.tools import cmd_bench

    p = argparse.ArgumentParser()
    cmd_bench.add_arguments(p)
    args = p.parse_args(["attention"])
    for tag, kern, *_ in kernel_configs(args.kernel, args.tune):
        assert kern is None or kern in KERNELS, (tag, kern)


def _library_files(suffixes=(".py",)):
    for top in LIBRARY:
        for p in sorted((ROOT / top).rglob("*")):
            if p.suffix in suffixes and p.is_file():
                yield p


def test_the_library_never_spells_a_former_name():
    found = []
    for p in _library_files():
        rel = p.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(p.read_text(), rel)):
            if isinstance(node, ast.Constant) and node.value in FORMER:
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not found, found


def test_the_library_text_names_kernels_by_their_current_names():
    """Comments, docstrings and kernel sources too: no "kernel v3", no file or kernel named after a version."""
    said = re.compile(r"\b[Kk]ernels? v[123]\b|split_v[0-9]|\b(?:v[123]|V[123])_[A-Za-z]|_(?:v[123]|V[123])\b|"
                      r"[\"']v[123][\"']")
    found = []
    for p in _library_files((".py", ".cpp", ".h")):
        rel = p.relative_to(ROOT).as_posix()
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if said.search(line):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, found
    names = sorted(p.name for p in (ROOT / "metal" / "kernels").glob("attention_kernel_split*.cpp"))
    assert names == ["attention_kernel_split_int8_mma.cpp", "attention_kernel_split_lanes.cpp",
                     "attention_kernel_split_tiles.cpp"]


def _record_kernels(node, out: set) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "kernel" and isinstance(v, str):
                out.add(v)
            _record_kernels(v, out)
    elif isinstance(node, list):
        for v in node:
            _record_kernels(v, out)


def test_committed_records_name_kernels_the_history_table_maps():
    """Records are history and keep the names of their day; each kernel one names is a current name or
    a former one that docs/kernel-history.md's table maps to a current one."""
    from tqbridge.tools import records as R

    table = _history_table()
    seen: set = set()
    for p in R.paths(ROOT):
        _record_kernels(json.loads(p.read_text()), seen)
    assert seen, "no record names a kernel"
    assert seen <= set(KERNELS) | set(table), seen - set(KERNELS) - set(table)
    assert seen & set(table)   # the records this table exists for
    assert set(table.values()) == set(KERNELS)
