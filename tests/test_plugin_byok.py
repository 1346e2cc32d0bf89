"""Bring your own kernel: fuzz_kernel finds planted bugs, shrinks them and writes a runnable snippet."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tqbridge.parity import testing as tqt
from tqbridge.parity.plugin.byok import KernelClaimError, make_claim
from tqbridge.parity.plugin.byok_source import dialect_kernel, mlx_source_kernel

# the planted-bug kernels of docs/plugin.md's worked example (not part of the package)
EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
sys.path.insert(0, str(EXAMPLES))
import fuzz_demo  # noqa: E402

Q8_0_BODY = """
uint i = tq_gx * tq_tg_size + tq_tid;
if (i < params[0]) {
    float d = tq_f16_bits_to_f32((uint)blocks[i * TYPE_SIZE] | ((uint)blocks[i * TYPE_SIZE + 1] << 8));
    for (uint j = 0; j < BLOCK_SIZE; j++) {
        int q = (int)blocks[i * TYPE_SIZE + 2 + j];
        y[i * BLOCK_SIZE + j] = tq_mul(d, (float)(q > 127 ? q - 256 : q));
    }
}
"""


def test_correct_kernels_pass():
    r = tqt.fuzz_kernel(fuzz_demo.dequantize_turbo4, max_examples=30, derandomize=True)
    assert r.ok, r.report()
    assert r.examples >= 30 and r.formats == {"turbo4@fork-pr197"} and len(r.shapes) > 1


def test_old_turbo4_table_is_caught_shrunk_and_the_snippet_reproduces_it(tmp_path):
    r = tqt.fuzz_kernel(fuzz_demo.dequantize_turbo4_old_table, max_examples=50, derandomize=True)
    assert not r.ok
    assert r.failure.op == "dequantize" and r.failure.arrays["blocks"].shape == (1, 66)   # one block
    assert "outside tolerance TURBO_DEQUANT_ULPS" in r.message
    assert "@example(case=CASE)" in r.snippet and "from fuzz_demo import" in r.snippet
    same = tqt.Case.from_text(r.failure.to_text())
    assert np.array_equal(same.arrays["blocks"], r.failure.arrays["blocks"]) and same.params == r.failure.params
    shutil.copy(EXAMPLES / "fuzz_demo.py", tmp_path)   # the snippet imports it from its own folder
    script = tmp_path / "test_repro.py"
    script.write_text(r.snippet)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "AssertionError: values (dequantize turbo4@fork-pr197)" in p.stderr


def test_missing_gqa_index_is_caught_at_a_gqa_shape():
    r = tqt.fuzz_kernel(fuzz_demo.attention_missing_gqa_index, max_examples=60, derandomize=True)
    assert not r.ok
    b, hq, hkv, t, d, lmax = r.failure.shape
    assert hkv >= 2 and hq // hkv >= 2, r.failure     # the bug needs several KV heads and a GQA group
    assert "exceed the oracle bound" in r.message


def test_dialect_kernel_source_is_fuzzed_on_the_emulator():
    good = dialect_kernel(Q8_0_BODY, op="dequantize", fmt="q8_0", backend="cpu-emulator")
    assert tqt.fuzz_kernel(good, max_examples=20, derandomize=True).ok
    bad = dialect_kernel(Q8_0_BODY.replace("(q > 127 ? q - 256 : q)", "q"), op="dequantize", fmt="q8_0",
                         backend="cpu-emulator")
    r = tqt.fuzz_kernel(bad, max_examples=40, derandomize=True)
    assert not r.ok and r.failure.arrays["blocks"].shape == (1, 34)
    assert "fn = ...  # your kernel" in r.snippet      # a wrapped source cannot be imported by name


def test_claims_are_checked():
    with pytest.raises(KernelClaimError, match="unknown op 'attention'"):
        make_claim("attention")
    with pytest.raises(KernelClaimError, match="format pair"):
        make_claim("decode-attention", "q8_0")
    with pytest.raises(KernelClaimError, match="unknown format"):
        make_claim("quantize", "q3_0")
    with pytest.raises(KernelClaimError, match="say which op"):
        tqt.fuzz_kernel(lambda x: x)
    with pytest.raises(KernelClaimError, match="quantize or dequantize"):
        dialect_kernel(Q8_0_BODY, op="decode-attention", fmt="q8_0")
    from tqbridge.metal import backends

    if "metal" not in backends():
        with pytest.raises(KernelClaimError, match="needs MLX's metal backend"):
            mlx_source_kernel("y[0] = 0;", op="dequantize", fmt="q8_0", backend="metal")


def test_snippet_of_our_own_kernel_rebuilds_it_and_runs(tmp_path):
    from tqbridge.parity.plugin.fuzz import our_target

    fn, claim = our_target("append", "reference")
    rng = np.random.default_rng(3)
    case = tqt.Case("append", ("q5_1",), {"k0": rng.standard_normal((1, 2, 3, 64)).astype(np.float32),
                                          "v0": rng.standard_normal((1, 2, 3, 64)).astype(np.float32)})
    assert tqt.check_case(fn, case) == 0.0
    text = tqt.snippet(fn, case, claim)
    assert "our_target('append', 'reference')" in text
    script = tmp_path / "repro.py"
    script.write_text(text)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
