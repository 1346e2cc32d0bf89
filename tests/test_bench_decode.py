"""``tqbridge bench decode`` on the CPU: the smoke run CI can afford (a tiny geometry, short context).
The real numbers come from the H200 (BENCHMARKS.md); here: it runs, records every field, counts."""

from __future__ import annotations

import json

from tqbridge.tools.cli import main


def test_bench_decode_smoke(tmp_path, capsys):
    out = tmp_path / "decode.json"
    rc = main(["bench", "decode", "--models", "tiny", "--context", "80", "--caches", "fp16,q8_0/turbo3,q8_0/q4_0",
               "--tokens", "5", "--rounds", "2", "--json", str(out)])
    assert rc == 0
    rec = json.loads(out.read_text())
    assert rec["command"].startswith("tqbridge bench decode --models tiny")
    runs = {r["cache"]: r for r in rec["runs"]}
    assert set(runs) == {"fp16", "q8_0/turbo3", "q8_0/q4_0"}
    for kind, r in runs.items():
        assert "error" not in r, r
        assert r["ms_per_token"] > 0 and len(r["ms_per_token_rounds"]) == 2
        assert r["kv_path_kernels_per_layer"] >= 1
        assert r["kv_path_host_syncs_per_step"] == 0, (kind, r["kv_path_host_syncs_per_step"])
    # resident bytes measured from the buffers: the quantized caches hold fewer than fp16's
    assert runs["q8_0/turbo3"]["kv_bytes"] < runs["fp16"]["kv_bytes"] / 2
    assert runs["q8_0/turbo3"]["decode_paths"]["decode:reference"] > 0   # CPU: the ops reference decodes
    assert "q8_0/turbo3" in capsys.readouterr().out


def test_bench_decode_refuses_bad_spellings(capsys):
    assert main(["bench", "decode", "--models", "tiny", "--caches", "fp16,q9_9/turbo3"]) == 2
    assert "--caches" in capsys.readouterr().err


def test_q_precision_suffix_reaches_the_caches(capsys):
    from tqbridge.metal.lm import decode_bench

    model, _ = decode_bench.build_model("tiny")
    caches = decode_bench.make_caches(model, "q8_0/turbo3@int8")
    assert caches and all(c.q_precision == "int8" for c in caches)
    assert all(c.q_precision is None for c in decode_bench.make_caches(model, "q8_0/turbo3"))
    assert main(["bench", "decode", "--models", "tiny", "--caches", "q8_0/turbo3@fp8"]) == 2
    assert "q precision" in capsys.readouterr().err
