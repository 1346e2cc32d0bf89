"""The logits level's verdict does not depend on the BLAS (issue 46, item 4): on a tiny random-weight model
the level runs once with the OpenBLAS tqbridge prefers and once with MLX's bundled reference BLAS
(``TQBRIDGE_BLAS=bundled``), each in a child process (the choice is made before MLX loads), and every
row's verdict is the same; a planted KV bug (the high bit of two codes of every q4_0 block flipped in
TQCache's quantizer) still fails it. ~30 s on 2 cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("mlx.core", reason="MLX is not installed")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

KV = ["f16", "q8_0", "q4_0", "q8_0/q4_0"]
TOKENS = 24
DECODE = 4

_CHILD = r"""
import json, sys
from tqbridge.bridge.mlx_blas import prefer_fast_blas
blas = prefer_fast_blas()
from tqbridge.parity.harness.level_logits import run_logits
res = run_logits(sys.argv[1], sys.argv[2].split(","), n_tokens=int(sys.argv[3]), exact_weights=True,
                 decode=int(sys.argv[4]))
print(json.dumps({"blas": blas, "rows": [{k: r.get(k) for k in ("kv", "pass", "kl_mean", "baseline", "claim")}
                                         for r in res.rows]}))
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tqbridge.bridge.gguf.fixtures import write_fixture

    return str(write_fixture(tmp_path_factory.mktemp("blas") / "llama.gguf", "llama"))


def _run(path: str, blas: "str | None") -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TQBRIDGE_BLAS", "TQBRIDGE_OPENBLAS")}
    if blas:
        env["TQBRIDGE_BLAS"] = blas
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    r = subprocess.run([sys.executable, "-c", _CHILD, path, ",".join(KV), str(TOKENS), str(DECODE)],
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_verdict_is_the_same_on_both_blas(tiny):
    fast, bundled = _run(tiny, None), _run(tiny, "bundled")
    print(fast["blas"], "|", bundled["blas"])
    for a, b in zip(fast["rows"], bundled["rows"]):
        print(a["kv"], a["kl_mean"], b["kl_mean"], a["baseline"], b["baseline"])
    assert [r["kv"] for r in fast["rows"]] == [r["kv"] for r in bundled["rows"]] == KV
    assert [r["pass"] for r in fast["rows"]] == [r["pass"] for r in bundled["rows"]] == [True] * len(KV)


def test_a_planted_kv_bug_fails_the_quantized_rows(tiny, monkeypatch):
    from tqbridge.metal.lm import cache as tqc
    from tqbridge.parity.harness.level_logits import run_logits

    clean = run_logits(tiny, ["q4_0"], n_tokens=TOKENS, exact_weights=True, decode=DECODE)
    assert clean.passed
    real = tqc.quantizer

    def flipped(fmt, *a, **kw):
        fn, name = real(fmt, *a, **kw)
        if tqc.get_format(fmt).key != "q4_0":
            return fn, name
        import mlx.core as mx

        def bad(x):
            b = fn(x)
            mask = np.zeros(b.shape[-1], np.uint8)
            mask[2::18] = 0x88      # byte 2 of each block: the high bits of codes 0 and 16
            return mx.bitwise_xor(b, mx.array(mask))
        return bad, name + " (planted)"

    monkeypatch.setattr(tqc, "quantizer", flipped)
    res = run_logits(tiny, ["q4_0"], n_tokens=TOKENS, exact_weights=True, decode=DECODE)
    row = res.rows[0]
    assert row["pass"] is False, row["claim"]
    assert row["baseline"]["mlx_kl_mean"] > 2 * row["baseline"]["llama_kl_mean"], row["baseline"]
