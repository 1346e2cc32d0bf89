"""The pass-1 kernels' names (``lanes``, ``tiles``, ``int8-mma``: attention_problem.KERNELS) and the
former ones (``v1``, ``v2``, ``v3``: attention_problem.KERNEL_ALIASES): a former name is still taken as
input, with a DeprecationWarning (Python) or one line on stderr (the CLI) naming the new one, and runs
exactly as the new one; nothing outputs a former name; the library spells them in the alias table only;
committed benchmark records, which keep the names of their day, all map to a current name."""

from __future__ import annotations

import argparse
import ast
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from tqbridge import bridge
from tqbridge.metal import attention_plan
from tqbridge.metal.attention import check_problem, decode_attention, last_run
from tqbridge.metal.attention_problem import (KERNEL_ALIASES, KERNELS, AttentionError, kernel_name,
                                              renamed_kernel)

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("bridge", "metal", "parity", "tools")
OLD = sorted(KERNEL_ALIASES)


def _case(rows: int = 4, length: int = 40):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, rows, 128)).astype(np.float32)
    kb = bridge.quantize("q8_0", rng.standard_normal((1, 1, length, 128)))
    vb = bridge.quantize("q4_0", rng.standard_normal((1, 1, length, 128)))
    return q, kb, vb, dict(k_format="q8_0", v_format="q4_0", length=length)


def test_the_names_and_their_former_ones():
    assert KERNELS == ("lanes", "tiles", "int8-mma")
    assert KERNEL_ALIASES == {"v1": "lanes", "v2": "tiles", "v3": "int8-mma"}
    assert not set(KERNEL_ALIASES) & set(KERNELS)
    for name in KERNELS:   # usable on a command line and inside a comma-separated --kernel / --tune list
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name), name


@pytest.mark.parametrize("old", OLD)
def test_a_former_name_maps_to_the_new_one_with_a_warning(old):
    new = KERNEL_ALIASES[old]
    with pytest.warns(DeprecationWarning, match=f"kernel '{old}' is now called '{new}'"):
        assert kernel_name(old) == new
    with pytest.warns(DeprecationWarning, match=f"'{new}'"):
        assert renamed_kernel(old) == new
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # the current names, None and anything else pass without a warning
        assert kernel_name(new) == new and kernel_name(None) is None
        assert renamed_kernel(new) == new and renamed_kernel("v9") == "v9" and renamed_kernel(None) is None


@pytest.mark.parametrize("backend", ["cpu-emulator", "cuda", "metal"])
@pytest.mark.parametrize("old", OLD)
def test_a_plan_made_with_a_former_name_is_the_plan_of_the_new_one(old, backend):
    q, kb, vb, kw = _case()
    prob = check_problem(q, kb, vb, **kw)
    want = attention_plan.make_plan(prob, backend, kernel=KERNEL_ALIASES[old])
    with pytest.warns(DeprecationWarning, match=KERNEL_ALIASES[old]):
        got = attention_plan.make_plan(prob, backend, kernel=old)
    assert got == want and got.kernel == KERNEL_ALIASES[old]


@pytest.mark.parametrize("old", OLD)
def test_resolve_kernel_takes_a_former_name(old):
    q, kb, vb, kw = _case()
    prob = check_problem(q, kb, vb, **kw)
    qp = "int8" if old == "v3" else "exact"
    with pytest.warns(DeprecationWarning):
        assert attention_plan.resolve_kernel(prob, "cuda", old, qp) == KERNEL_ALIASES[old]
    with pytest.warns(DeprecationWarning), pytest.raises(AttentionError, match="'int8-mma'"):
        # the former name is checked as its new one: int8-mma quantizes q, so exact q refuses it
        attention_plan.resolve_kernel(prob, "cuda", "v3", "exact")


@pytest.mark.parametrize("old", OLD)
def test_decode_attention_runs_a_former_name_as_the_new_one(old):
    """The call warns once, runs the new name's plan (same output bits) and records the new name."""
    q, kb, vb, kw = _case()
    new = KERNEL_ALIASES[old]
    extra = {"q_precision": "int8"} if new == "int8-mma" else {}
    want = decode_attention(q, kb, vb, backend="cpu-emulator", kernel=new, seed=1, **extra, **kw)
    want_run = last_run()
    with pytest.warns(DeprecationWarning, match=f"'{old}' is now called '{new}'") as caught:
        got = decode_attention(q, kb, vb, backend="cpu-emulator", kernel=old, seed=1, **extra, **kw)
    assert len([w for w in caught if issubclass(w.category, DeprecationWarning)]) == 1
    assert caught[0].filename == __file__   # the warning points at the caller's line
    assert np.array_equal(got, want)
    assert last_run() == want_run and last_run()["kernel"] == new


@pytest.mark.parametrize("bad", ["v4", "V2", "fast", "lanes ", ""])
def test_an_unknown_name_lists_the_valid_ones(bad):
    q, kb, vb, kw = _case()
    prob = check_problem(q, kb, vb, **kw)
    listed = "choose one of lanes, tiles, int8-mma"
    with pytest.raises(AttentionError, match=re.escape(f"unknown kernel {bad!r}; {listed}")):
        attention_plan.make_plan(prob, "cuda", kernel=bad)
    with pytest.raises(AttentionError, match=re.escape(listed)):
        decode_attention(q, kb, vb, backend="cpu-emulator", kernel=bad, **kw)
    with pytest.raises(AttentionError, match=re.escape(listed)):
        kernel_name(bad)


def _bench_args(kernel: str, tune: str) -> argparse.Namespace:
    return argparse.Namespace(kernel=kernel, tune=tune)


def test_bench_takes_former_names_with_one_note_each(capsys):
    from tqbridge.tools.cmd_bench import _kernel_configs

    new = _kernel_configs(_bench_args("auto,tiles,int8-mma,lanes", "tiles:8x64,int8-mma:2x64,lanes:16x4x64,16x4"),
                          KERNELS)
    assert capsys.readouterr().err == ""
    old = _kernel_configs(_bench_args("auto,v2,v3,v1", "v2:8x64,v3:2x64,v1:16x4x64,16x4"), KERNELS)
    assert old == new   # the same configurations, tagged with the current names
    assert [c[0] for c in new] == ["fused", "fused_tiles", "fused_int8-mma", "fused_lanes", "fused_tiles_8x64",
                                   "fused_int8-mma_2x64", "fused_lanes_16x4x64", "fused_lanes_16x4"]
    err = capsys.readouterr().err.splitlines()
    assert err == ["tqbridge bench: --kernel: kernel 'v2' is now called 'tiles'; the old name is deprecated",
                   "tqbridge bench: --kernel: kernel 'v3' is now called 'int8-mma'; the old name is deprecated",
                   "tqbridge bench: --kernel: kernel 'v1' is now called 'lanes'; the old name is deprecated",
                   "tqbridge bench: --tune: kernel 'v2' is now called 'tiles'; the old name is deprecated",
                   "tqbridge bench: --tune: kernel 'v3' is now called 'int8-mma'; the old name is deprecated",
                   "tqbridge bench: --tune: kernel 'v1' is now called 'lanes'; the old name is deprecated"]
    _kernel_configs(_bench_args("v2", "v2:8x64,v2:2x64"), KERNELS)   # one note per option and name
    assert len(capsys.readouterr().err.splitlines()) == 2


@pytest.mark.parametrize("kernel, tune, says", [
    ("auto,v9", "", "--kernel: unknown kernel 'v9'; choose from auto, lanes, tiles, int8-mma"),
    ("auto", "v9:8x64", "--tune: 'v9:8x64' is not tiles:WARPSxTILE, int8-mma:WARPSxTILE[xCHUNKS] or lanes:LPKxWARPS[xTILE]"),
    ("auto", "tiles:8x64x2", "is not tiles:WARPSxTILE"),
    ("auto", "int8-mma:4x64x1x2", "is not tiles:WARPSxTILE"),
])
def test_bench_refuses_unknown_kernels_naming_the_valid_ones(kernel, tune, says):
    from tqbridge.tools.cli import CliError
    from tqbridge.tools.cmd_bench import _kernel_configs

    with pytest.raises(CliError, match=re.escape(says)):
        _kernel_configs(_bench_args(kernel, tune), KERNELS)


def test_bench_defaults_name_current_kernels():
    from tqbridge.tools import cmd_bench

    p = argparse.ArgumentParser()
    cmd_bench.add_arguments(p)
    args = p.parse_args(["attention"])
    for tag, kern, *_ in cmd_bench._kernel_configs(args, KERNELS):
        assert kern is None or kern in KERNELS, (tag, kern)


def _library_files(suffixes=(".py",)):
    for top in LIBRARY:
        for p in sorted((ROOT / top).rglob("*")):
            if p.suffix in suffixes and p.is_file():
                yield p


def _alias_table_lines() -> range:
    """The lines of ``KERNEL_ALIASES = {...}`` in attention_problem.py: the one place old names may appear."""
    path = ROOT / "metal" / "attention_problem.py"
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["KERNEL_ALIASES"]:
            return range(node.lineno, node.end_lineno + 1)
    raise AssertionError("KERNEL_ALIASES is not assigned at the top level of metal/attention_problem.py")


def test_the_library_spells_former_names_only_in_the_alias_table():
    allowed = _alias_table_lines()
    found = []
    for p in _library_files():
        rel = p.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(p.read_text(), rel)):
            if isinstance(node, ast.Constant) and node.value in KERNEL_ALIASES:
                if not (rel == "metal/attention_problem.py" and node.lineno in allowed):
                    found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not found, found


def test_the_library_text_names_kernels_by_their_current_names():
    """Comments, docstrings and kernel sources too: no "kernel v3", no file or kernel named after a version."""
    said = re.compile(r"\b[Kk]ernels? v[123]\b|split_v[0-9]|\b(?:v[123]|V[123])_[A-Za-z]|_(?:v[123]|V[123])\b|"
                      r"[\"']v[123][\"']")
    allowed = _alias_table_lines()
    found = []
    for p in _library_files((".py", ".cpp", ".h")):
        rel = p.relative_to(ROOT).as_posix()
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if said.search(line) and not (rel == "metal/attention_problem.py" and i in allowed):
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


def test_committed_records_name_kernels_the_alias_table_maps():
    """Records are history and keep the names of their day; each kernel one names is a current name or
    a former one that KERNEL_ALIASES maps, so anything reading records can translate it."""
    from tqbridge.tools import records as R

    seen: set = set()
    for p in R.paths(ROOT):
        _record_kernels(json.loads(p.read_text()), seen)
    assert seen, "no record names a kernel"
    assert seen <= set(KERNELS) | set(KERNEL_ALIASES), seen - set(KERNELS) - set(KERNEL_ALIASES)
    assert seen & set(KERNEL_ALIASES)   # the records this table exists for


def test_kernel_history_maps_the_former_names():
    """docs/kernel-history.md holds the table of former -> current names, the same as the library's."""
    text = (ROOT / "docs" / "kernel-history.md").read_text()
    rows = re.findall(r"^\| `(v[0-9])` \| `([a-z0-9-]+)` \|", text, re.M)
    assert dict(rows) == KERNEL_ALIASES, rows
