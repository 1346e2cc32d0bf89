"""KV caches across the runtimes (``tqbridge convert --to prompt-cache | session | sequence-state``):
llama.cpp session files <-> mlx-lm prompt caches of TQCache layers.

Without a model: the row <-> block layout, the rotation groups, the checks against a model's geometry.
With SmolLM2 (marked ``model``; F32 weights so that f16 caches give the same greedy tokens in both
runtimes, as in the KV transplant): byte-exact round trips both ways for f16 and q8_0/q4_0 caches,
decoding on from a converted cache in the other runtime, ``--kv`` re-quantization, and the CLI's
one-line errors.
"""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest

from tqbridge.bridge.mlx_blas import prefer_fast_blas

prefer_fast_blas()

mx = pytest.importorskip("mlx.core", reason="MLX is not installed (pip install 'tqbridge[mlx]')")

from tqbridge.bridge import dequantize, get_format, quantize  # noqa: E402
from tqbridge.bridge.llama.kv_files import (KVGeometry, check_against_model, parse_session_file,  # noqa: E402
                                      session_from_layers)
from tqbridge.bridge.llama.state import StateError  # noqa: E402
from tqbridge.metal.lm.prompt_cache_convert import caches_to_rows, layers_to_caches  # noqa: E402

PROMPT = ("The quick brown fox jumps over the lazy dog. Parity between llama.cpp and MLX is checked "
          "at four levels: blocks, cache, attention and logits.")
N_NEW = 8


def _rows(fmt: str, cells: int, heads: int, dim: int, seed: int) -> "tuple[np.ndarray, np.ndarray]":
    """(float values (cells, heads, dim), llama.cpp rows (cells, heads * bytes)) of ``fmt``."""
    x = np.random.default_rng(seed).standard_normal((cells, heads, dim)).astype(np.float32)
    blocks = quantize(fmt, x.reshape(cells * heads, dim))
    return x, blocks.reshape(cells, -1)


def _session(pairs, cells=5, heads=2, dim=64, kind="session"):
    layers = []
    for i, (k, v) in enumerate(pairs):
        layers.append((get_format(k).type_ids["ggml"], _rows(k, cells, heads, dim, 2 * i)[1],
                       get_format(v).type_ids["ggml"], _rows(v, cells, heads, dim, 2 * i + 1)[1]))
    return session_from_layers(kind, list(range(10, 10 + cells)), layers, "llama")


GEO = KVGeometry("llama", 2, 2, 64, 64, 100, file="tiny.gguf")


@pytest.mark.parametrize("kind", ["session", "sequence"])
@pytest.mark.parametrize("pair", [("f16", "f16"), ("q8_0", "q4_0")])
def test_rows_become_blocks_and_back_unchanged(pair, kind):
    sf = parse_session_file(_session([pair, pair], kind=kind).to_bytes())
    layers = check_against_model(sf, GEO)
    caches = layers_to_caches(layers, GEO.n_kv_heads, GEO.head_dim, "llama")
    for L, c in zip(layers, caches):
        kb, vb = (np.array(b) for b in c.blocks())
        assert kb.shape[:3] == (1, 2, 5)
        # head h of cell t in llama.cpp's row is TQCache's block [0, h, t]
        per_head = L.k.reshape(5, 2, -1)
        assert np.array_equal(kb[0, 1, 3], per_head[3, 1]) and np.array_equal(kb[0].transpose(1, 0, 2), per_head)
        assert np.array_equal(vb[0].transpose(1, 0, 2), L.v.reshape(5, 2, -1))
        # llama.cpp rotates quantized rows (K by 64 for 64-value heads, V by 64); f16 is not rotated
        assert (c.k_rot, c.v_rot) == ((64, 64) if pair[0] == "q8_0" else (0, 0))
    back = session_from_layers(kind, sf.tokens, caches_to_rows(caches), "llama")
    assert back.to_bytes() == sf.to_bytes()


def test_values_come_back_per_head_and_position():
    """f16 rows decode (TQCache.fetch) to the values written: heads and positions in place."""
    x, rows = _rows("f16", 4, 2, 64, seed=7)
    t = get_format("f16").type_ids["ggml"]
    sf = session_from_layers("session", [1, 2, 3, 4], [(t, rows, t, rows), (t, rows, t, rows)], "llama")
    (c, _) = layers_to_caches(check_against_model(sf, GEO), 2, 64)
    k, v = (np.array(a) for a in c.fetch(mx.float32))
    want = x.astype(np.float16).astype(np.float32).transpose(1, 0, 2)[None]
    assert np.array_equal(k, want) and np.array_equal(v, want)


@pytest.mark.parametrize("mutate, message", [
    (lambda sf: sf.tokens.pop(), "lists 4 tokens but its cache holds 5 positions"),
    (lambda sf: sf.tokens.__setitem__(0, 100), "outside tiny.gguf's vocabulary"),
    (lambda sf: setattr(sf.state, "arch", "gemma3"), "written by a gemma3 model"),
    (lambda sf: sf.state.caches[0].streams[0].layers.pop(), "has 1 layers; tiny.gguf has 2"),
    (lambda sf: sf.state.caches[0].streams[0].pos.__setitem__(2, 7), "not positions 0..n-1"),
])
def test_checks_against_the_model(mutate, message):
    sf = parse_session_file(_session([("f16", "f16")] * 2).to_bytes())
    mutate(sf)
    with pytest.raises(StateError, match=message.replace(".", r"\.")):
        check_against_model(sf, GEO)


def test_another_models_geometry_is_refused():
    sf = parse_session_file(_session([("q8_0", "q4_0")] * 2).to_bytes())
    with pytest.raises(StateError, match="not this model's file"):
        check_against_model(sf, KVGeometry("llama", 2, 3, 64, 64, 100, file="other.gguf"))


# ---------------------------------------------------------------- SmolLM2, both runtimes


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    try:
        import llama_cpp  # noqa: F401
        import mlx_lm  # noqa: F401
    except ImportError as e:  # pragma: no cover
        pytest.skip(f"needs llama-cpp-python and mlx-lm: {e}")
    from tqbridge.bridge.gguf.f32 import cached_f32_gguf
    from tqbridge.bridge.gguf.models import ModelUnavailable, smollm2_path
    from tqbridge.parity.harness.runtimes import LlamaCppRuntime, MLXRuntime

    try:
        path = str(cached_f32_gguf(smollm2_path()))
    except ModelUnavailable as e:
        pytest.skip(str(e))
    tokens = LlamaCppRuntime(path).tokenize(PROMPT)
    return {"path": path, "tokens": tokens, "mlx": MLXRuntime(path), "dir": tmp_path_factory.mktemp("kv"),
            "llama": {}}


def _llama(smol, pair):
    from tqbridge.parity.harness.transplant import LlamaSession

    return LlamaSession(smol["path"], *pair, n_ctx=256, n_threads=2)


def llama_session(smol, pair, n_new=N_NEW):
    """llama.cpp prefills the prompt with a ``pair`` cache, saves a session file
    (``llama_state_save_file``), then decodes on: (file, first token, its continuation, the logits of
    its first decode step)."""
    import llama_cpp

    from tqbridge.parity.harness.transplant import greedy_llama

    key = "/".join(pair)
    if key not in smol["llama"] or len(smol["llama"][key][2]) < n_new:
        path = smol["dir"] / f"llama-{key.replace('/', '-')}.bin"
        llm = _llama(smol, pair)
        try:
            toks = smol["tokens"]
            first = int(np.argmax(llm.eval(toks)))
            arr = (llama_cpp.llama_token * len(toks))(*toks)
            assert llama_cpp.llama_state_save_file(llm.llm._ctx.ctx, str(path).encode(), arr, len(toks))
            step = np.array(llm.eval([first]), np.float64)
            cont = [int(np.argmax(step))] + greedy_llama(llm, int(np.argmax(step)), n_new - 1)
        finally:
            llm.close()
        smol["llama"][key] = (path, first, cont, step)
    return smol["llama"][key]


def llama_from_file(smol, pair, path, first, n_new=N_NEW):
    """A fresh llama.cpp context loads the session file at ``path`` and decodes on from ``first``:
    (the logits of its first step, its continuation)."""
    import llama_cpp

    from tqbridge.parity.harness.transplant import greedy_llama

    llm = _llama(smol, pair)
    try:
        cap = 1024
        toks = (llama_cpp.llama_token * cap)()
        n = ctypes.c_size_t(0)
        assert llama_cpp.llama_state_load_file(llm.llm._ctx.ctx, str(path).encode(), toks, cap, ctypes.byref(n))
        got = list(toks[: n.value])
        llm.llm.n_tokens = len(got)
        llm.llm.input_ids[: len(got)] = got
        llm.n_past = len(got)
        step = np.array(llm.eval([first]), np.float64)
        cont = [int(np.argmax(step))] + greedy_llama(llm, int(np.argmax(step)), n_new - 1)
    finally:
        llm.close()
    return got, step, cont


def mlx_on(smol, caches, first, n_new=N_NEW):
    """MLX decodes on from ``caches``: (the logits of its first step, its continuation)."""
    from tqbridge.parity.harness.transplant import greedy_mlx

    model = smol["mlx"].model
    step = np.array(model(mx.array([[first]], dtype=mx.int32), cache=caches)[0, -1], np.float64)
    tok = int(np.argmax(step))
    return step, [tok] + greedy_mlx(model, caches, tok, n_new - 1)


def kl(p_logits, q_logits) -> float:
    """KL(p || q) of the softmax distributions, in nats."""
    def logp(x):
        x = x - x.max()
        return x - np.log(np.exp(x).sum())

    a, b = logp(p_logits), logp(q_logits)
    return float((np.exp(a) * (a - b)).sum())


def mlx_prompt_cache(smol, pair, path, n_new=N_NEW):
    """MLX prefills the prompt into TQCache layers of ``pair`` and saves the prompt cache with its
    tokens: (first token, MLX's continuation, the logits of its first decode step)."""
    from tqbridge.bridge.llama.kv_files import kv_geometry
    from tqbridge.metal.lm.cache import make_cache
    from tqbridge.metal.lm.prompt_cache_convert import save_tq_prompt_cache

    model = smol["mlx"].model
    cache = make_cache(model, *pair)
    logits = model(mx.array(smol["tokens"], dtype=mx.int32)[None], cache=cache)
    first = int(mx.argmax(logits[0, -1]).item())
    save_tq_prompt_cache(path, cache, smol["tokens"], kv_geometry(smol["path"]))
    step, cont = mlx_on(smol, cache, first, n_new)
    return first, cont, step


def _load(path):
    from tqbridge.metal.lm.prompt_cache import load_prompt_cache

    return load_prompt_cache(path, return_metadata=True)


@pytest.mark.model
@pytest.mark.parametrize("pair", [("f16", "f16"), ("q8_0", "q4_0")])
def test_llama_session_to_prompt_cache_and_back_is_byte_exact(smol, pair):
    from tqbridge.metal.lm.prompt_cache_convert import prompt_cache_to_session, session_to_prompt_cache

    path, *_ = llama_session(smol, pair, n_new=1)
    pc, back = smol["dir"] / f"pc-{pair[0]}.safetensors", smol["dir"] / f"back-{pair[0]}.bin"
    s = session_to_prompt_cache(path, pc, smol["path"])
    assert s["blocks"] == "moved unchanged" and s["tokens"] == len(smol["tokens"])
    sf = parse_session_file(path.read_bytes())
    caches, meta = _load(pc)
    assert json.loads(meta["tqbridge_tokens"]) == sf.tokens == smol["tokens"]
    for L, c in zip(sf.state.layers(), caches):
        kb, vb = (np.array(b)[0].transpose(1, 0, 2) for b in c.blocks())
        assert np.array_equal(kb.reshape(kb.shape[0], -1), L.k) and np.array_equal(vb.reshape(vb.shape[0], -1), L.v)
        assert c.rotation == "llama" and (c.k_rot, c.v_rot) == ((64, 64) if pair[0] != "f16" else (0, 0))
    prompt_cache_to_session(pc, back, smol["path"])
    assert back.read_bytes() == path.read_bytes()


@pytest.mark.model
def test_f16_llama_session_decodes_on_in_mlx(smol):
    from tqbridge.metal.lm.prompt_cache_convert import session_to_prompt_cache

    path, first, cont, step = llama_session(smol, ("f16", "f16"))
    pc = smol["dir"] / "f16-fwd.safetensors"
    session_to_prompt_cache(path, pc, smol["path"])
    caches, _ = _load(pc)
    got_step, got = mlx_on(smol, caches, first)
    assert got == cont, (got, cont)
    assert kl(step, got_step) < 1e-4


@pytest.mark.model
def test_f16_mlx_prompt_cache_decodes_on_in_llama_cpp(smol):
    from tqbridge.metal.lm.prompt_cache_convert import prompt_cache_to_session, session_to_prompt_cache

    pc, out = smol["dir"] / "mlx-f16.safetensors", smol["dir"] / "mlx-f16.bin"
    first, cont, step = mlx_prompt_cache(smol, ("f16", "f16"), pc)
    prompt_cache_to_session(pc, out, smol["path"])
    toks, got_step, got = llama_from_file(smol, ("f16", "f16"), out, first)
    assert toks == smol["tokens"]
    assert got == cont, (got, cont)
    assert kl(step, got_step) < 1e-4
    # and back: the prompt cache's blocks again
    again = smol["dir"] / "mlx-f16-again.safetensors"
    session_to_prompt_cache(out, again, smol["path"])
    for a, b in zip(_load(pc)[0], _load(again)[0]):
        assert all(np.array_equal(np.array(x), np.array(y)) for x, y in zip(a.blocks(), b.blocks()))
        assert a.meta_state == b.meta_state


@pytest.mark.model
def test_quantized_caches_decode_on_in_the_other_runtime(smol):
    """q8_0/q4_0 both ways: the first decode step's KL against the runtime that wrote the cache."""
    from tqbridge.metal.lm.prompt_cache_convert import prompt_cache_to_session, session_to_prompt_cache

    pair = ("q8_0", "q4_0")
    path, first, cont, step = llama_session(smol, pair, n_new=1)
    pc = smol["dir"] / "q-fwd.safetensors"
    session_to_prompt_cache(path, pc, smol["path"])
    got_step, _ = mlx_on(smol, _load(pc)[0], first, 1)
    assert np.argmax(got_step) == np.argmax(step) and kl(step, got_step) < 0.01

    pc2, out = smol["dir"] / "mlx-q.safetensors", smol["dir"] / "mlx-q.bin"
    first2, cont2, step2 = mlx_prompt_cache(smol, pair, pc2, 1)
    prompt_cache_to_session(pc2, out, smol["path"])
    _, got_step2, _ = llama_from_file(smol, pair, out, first2, 1)
    assert np.argmax(got_step2) == np.argmax(step2) and kl(step2, got_step2) < 0.01


@pytest.mark.model
def test_kv_requantizes_from_decoded_values(smol):
    """--kv q8_0/q4_0 from llama.cpp's f16 cache: the blocks are tqbridge's (ggml's) quantizer on the
    decoded f16 values after llama.cpp's rotation; llama.cpp loads them back unchanged."""
    from tqbridge.metal.hadamard import hadamard_rotate
    from tqbridge.metal.lm.prompt_cache_convert import prompt_cache_to_session, session_to_prompt_cache

    path, first, cont, step = llama_session(smol, ("f16", "f16"))
    pc = smol["dir"] / "kv-q.safetensors"
    s = session_to_prompt_cache(path, pc, smol["path"], kv="q8_0/q4_0")
    assert s["blocks"] == "re-quantized from decoded values" and s["to"] == "q8_0/q4_0"
    sf = parse_session_file(path.read_bytes())
    caches, _ = _load(pc)
    for L, c in list(zip(sf.state.layers(), caches))[::7]:
        for side, rows, b, fmt in (("k", L.k, c.blocks()[0], "q8_0"), ("v", L.v, c.blocks()[1], "q4_0")):
            vals = dequantize("f16", rows.reshape(-1, 128), 64).reshape(rows.shape[0], 3, 64).transpose(1, 0, 2)
            rotated = np.array(hadamard_rotate(mx.array(vals), 64))
            want = quantize(fmt, rotated.reshape(-1, 64)).reshape(3, rows.shape[0], -1)
            assert np.array_equal(np.array(b)[0], want), side
    got_step, _ = mlx_on(smol, caches, first, 1)
    assert np.argmax(got_step) == np.argmax(step)
    # the re-quantized cache in llama.cpp: its q8_0/q4_0 context decodes on from it
    out = smol["dir"] / "kv-q.bin"
    prompt_cache_to_session(pc, out, smol["path"])
    _, l_step, _ = llama_from_file(smol, ("q8_0", "q4_0"), out, first, 1)
    assert np.argmax(l_step) == np.argmax(step) and kl(step, l_step) < 0.01


def _other_model(d) -> str:
    """A GGUF of another model's geometry (metadata only: 2 layers, 2 KV heads of 32, 50 tokens)."""
    import gguf

    path = d / "other.gguf"
    if not path.exists():
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_block_count(2)
        w.add_embedding_length(64)
        w.add_head_count(2)
        w.add_head_count_kv(2)
        w.add_token_list([f"t{i}" for i in range(50)])
        w.add_tensor("token_embd.weight", np.zeros((50, 64), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return str(path)


@pytest.mark.model
@pytest.mark.parametrize("case", ["truncated", "magic", "empty", "model", "prompt-cache-truncated",
                                  "prompt-cache-model", "no-tokens", "not-ggml"])
def test_malformed_inputs_end_in_one_line(smol, case, capsys):
    from mlx_lm.models.cache import save_prompt_cache

    from tqbridge.metal.lm.cache import make_cache
    from tqbridge.tools.cli import main

    good, *_ = llama_session(smol, ("f16", "f16"), n_new=1)
    d = smol["dir"]
    bad = d / f"bad-{case}"
    to, model, msg = "prompt-cache", "smollm2", None
    data = good.read_bytes()
    if case == "truncated":
        bad.write_bytes(data[: len(data) // 2]); msg = "truncated"
    elif case == "magic":
        bad.write_bytes(b"GGUF" + data[4:]); msg = "not a llama.cpp session file"
    elif case == "empty":
        bad.write_bytes(b""); msg = "too short"
    elif case == "model":
        bad.write_bytes(data); model, msg = _other_model(d), "not this model's file"
    else:
        to = "session"
        pc = d / "bad-src.safetensors"
        if not pc.exists():
            from tqbridge.metal.lm.prompt_cache_convert import session_to_prompt_cache

            session_to_prompt_cache(good, pc, smol["path"])
        if case == "prompt-cache-truncated":
            bad.write_bytes(pc.read_bytes()[:-100]); msg = "needs"
        elif case == "prompt-cache-model":
            bad = pc; model, msg = _other_model(d), "not this model's cache"
        elif case == "no-tokens":
            cache = make_cache(smol["mlx"].model, "f16", "f16")
            smol["mlx"].model(mx.array([[1, 2]], dtype=mx.int32), cache=cache)
            save_prompt_cache(str(bad) + ".safetensors", cache)
            bad = d / f"bad-{case}.safetensors"; msg = "lists no tokens"
        else:   # turbo3 is not a ggml type: llama.cpp cannot hold it
            bad, msg = pc, "not a ggml type"
    extra = ["--kv", "turbo3"] if case == "not-ggml" else []
    rc = main(["convert", str(bad), "--to", to, str(d / "out.bin"), "--model", model, *extra])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert msg in err, err


def test_docs_quote_the_record():
    """Every number of docs/conversions.md's KV-cache tables is the record's."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    rec = json.loads((root / "benchmarks/records/cpu/2026-12-03-kv-convert.json").read_text())["results"]
    doc = (root / "docs/conversions.md").read_text()
    section = doc[doc.index("## Measured: SmolLM2, both directions"):]
    n = rec["new_tokens"]

    def row(first: str) -> "list[str]":
        line = next(x for x in section.splitlines() if x.startswith(f"| {first} |"))
        return [c.strip() for c in line.strip("|").split("|")]

    def pair(cell: str) -> "tuple[int, float]":
        agree, k = cell.split(",")
        assert agree.endswith(f" of {n}")
        return int(agree.split()[0]), float(k)

    for kv in ("f16/f16", "q8_0/q8_0", "q8_0/q4_0"):
        a, b = rec["llama_to_mlx"][kv], rec["mlx_to_llama"][kv]
        c = row(kv)
        assert int(c[1].replace(",", "")) == a["session_file_bytes"]
        assert int(c[2].replace(",", "")) == a["prompt_cache_bytes"]
        assert c[3] == "yes / yes" and a["round_trip_bytes_equal"] and b["round_trip_blocks_equal"]
        assert pair(c[4]) == (a["agree"], float(f"{a['kl_first_step']:.1e}"))
        assert pair(c[5]) == (b["agree"], float(f"{b['kl_first_step']:.1e}"))
    for tag, v in rec["requantize"].items():
        c = row(tag.replace("->", " → "))
        assert int(c[1].replace(",", "")) == v["prompt_cache_bytes"]
        assert int(c[2].replace(",", "")) == v["session_file_bytes"]
        assert pair(c[3]) == (v["mlx_agree"], float(f"{v['mlx_kl_first_step']:.1e}"))
        assert pair(c[4]) == (v["llama_agree"], float(f"{v['llama_kl_first_step']:.1e}"))
    assert f"first {rec['prompt_tokens']} tokens" in section and f"{n} greedy tokens" in section
