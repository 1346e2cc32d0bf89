"""Record KV-cache conversions between llama.cpp session files and mlx-lm prompt caches (SmolLM2).

Per K/V pair: llama.cpp (F32 weights, flash attention, its default rotation) prefills the prompt and
saves a session file; ``session_to_prompt_cache`` converts it; MLX decodes on from the converted cache.
The reverse: MLX prefills into TQCache layers, ``prompt_cache_to_session`` converts, a fresh llama.cpp
context loads the file and decodes on. Reported: file sizes, whether the round trip gives the same
bytes, how many greedy tokens agree with the runtime that wrote the cache, and the first decode
step's KL (the writer's distribution against the reader's). ``--kv`` rows re-quantize an f16 cache.

    PYTHONPATH=. python benchmarks/scripts/record_kv_convert.py OUT.json [--tokens 64] [--new 16]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_env import header, write_record  # noqa: E402

from tqbridge.parity.harness.metrics import kl_per_position  # noqa: E402
from tqbridge.parity.harness.transplant import agreeing_prefix  # noqa: E402

PAIRS = ("f16/f16", "q8_0/q8_0", "q8_0/q4_0")
REQUANT = (("f16/f16", "q8_0/q4_0"), ("f16/f16", "q4_0/q4_0"))


def kl(p, q) -> float:
    """KL(softmax(p) || softmax(q)) of one step's logits."""
    return float(kl_per_position(np.asarray(p)[None], np.asarray(q)[None])[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--new", type=int, default=16)
    args = ap.parse_args(argv)

    from tqbridge.bridge.mlx_blas import prefer_fast_blas

    prefer_fast_blas()   # before MLX is imported (Linux CPU: OpenBLAS if installed)
    import llama_cpp
    import mlx.core as mx

    from tqbridge.bridge.evaluation_text import evaluation_text
    from tqbridge.bridge.gguf.f32 import cached_f32_gguf
    from tqbridge.bridge.llama.kv_files import kv_geometry
    from tqbridge.bridge.blocks.kv_spec import split_kv
    from tqbridge.bridge.gguf.models import smollm2_path
    from tqbridge.metal.lm.cache import make_cache
    from tqbridge.metal.lm.prompt_cache import load_prompt_cache
    from tqbridge.metal.lm.prompt_cache_convert import (prompt_cache_to_session, save_tq_prompt_cache,
                                                        session_to_prompt_cache)
    from tqbridge.parity.harness.runtimes import LlamaCppRuntime, MLXRuntime
    from tqbridge.parity.harness.transplant import LlamaSession, greedy_llama, greedy_mlx

    gguf = str(cached_f32_gguf(smollm2_path()))
    text, source = evaluation_text()
    tokens = LlamaCppRuntime(gguf).tokenize(text)[: args.tokens]
    model = MLXRuntime(gguf).model
    geo = kv_geometry(gguf)
    n = args.new

    def llama_decode(pair, tok, load=None, save=None):
        llm = LlamaSession(gguf, *split_kv(pair), n_ctx=256, n_threads=2)
        try:
            if load is None:
                tok = int(np.argmax(llm.eval(tokens)))
                arr = (llama_cpp.llama_token * len(tokens))(*tokens)
                assert llama_cpp.llama_state_save_file(llm.llm._ctx.ctx, str(save).encode(), arr, len(tokens))
            else:
                buf = (llama_cpp.llama_token * 1024)()
                cnt = ctypes.c_size_t(0)
                assert llama_cpp.llama_state_load_file(llm.llm._ctx.ctx, str(load).encode(), buf, 1024, ctypes.byref(cnt))
                llm.llm.n_tokens = cnt.value
                llm.llm.input_ids[: cnt.value] = list(buf[: cnt.value])
                llm.n_past = cnt.value
            step = llm.eval([tok])
            t1 = int(np.argmax(step))
            return tok, step, [t1] + greedy_llama(llm, t1, n - 1)
        finally:
            llm.close()

    def mlx_decode(cache, tok):
        step = np.array(model(mx.array([[tok]], dtype=mx.int32), cache=cache)[0, -1])
        t1 = int(np.argmax(step))
        return step, [t1] + greedy_mlx(model, cache, t1, n - 1)

    rec = {**header(("tqbridge", "mlx", "mlx-lm", "gguf", "llama_cpp_python", "numpy")),
           "script": f"benchmarks/scripts/record_kv_convert.py OUT.json --tokens {args.tokens} --new {args.new}",
           "model": "SmolLM2-135M-Instruct, F32 weights (tqbridge's F32 GGUF of the Q4_1 file)",
           "prompt": f"the first {len(tokens)} tokens of {source}", "prompt_tokens": len(tokens), "new_tokens": n, "llama_to_mlx": {}, "mlx_to_llama": {}, "requantize": {}}
    with tempfile.TemporaryDirectory(prefix="tqbridge-kv-record-") as tmp:
        d = Path(tmp)
        for pair in PAIRS:
            tag = pair.replace("/", "-")
            sess, pc, back = d / f"{tag}.bin", d / f"{tag}.safetensors", d / f"{tag}-back.bin"
            first, step, cont = llama_decode(pair, None, save=sess)
            s = session_to_prompt_cache(sess, pc, gguf)
            prompt_cache_to_session(pc, back, gguf)
            mstep, mcont = mlx_decode(load_prompt_cache(pc), first)
            rec["llama_to_mlx"][pair] = {
                "session_file_bytes": sess.stat().st_size, "prompt_cache_bytes": pc.stat().st_size,
                "kv_block_bytes": s["kv_bytes"], "round_trip_bytes_equal": back.read_bytes() == sess.read_bytes(),
                "agree": agreeing_prefix(cont, mcont), "kl_first_step": kl(step, mstep)}
            # MLX -> llama.cpp
            cache = make_cache(model, *split_kv(pair))
            logits = model(mx.array(tokens, dtype=mx.int32)[None], cache=cache)
            mfirst = int(mx.argmax(logits[0, -1]).item())
            mpc, msess, mback = d / f"m-{tag}.safetensors", d / f"m-{tag}.bin", d / f"m-{tag}-back.safetensors"
            save_tq_prompt_cache(mpc, cache, tokens, geo)
            mstep, mcont = mlx_decode(cache, mfirst)
            prompt_cache_to_session(mpc, msess, gguf)
            session_to_prompt_cache(msess, mback, gguf)
            same = all(np.array_equal(np.array(x), np.array(y)) for a, b in zip(load_prompt_cache(mpc), load_prompt_cache(mback))
                       for x, y in zip(a.blocks(), b.blocks()))
            _, lstep, lcont = llama_decode(pair, mfirst, load=msess)
            rec["mlx_to_llama"][pair] = {
                "prompt_cache_bytes": mpc.stat().st_size, "session_file_bytes": msess.stat().st_size,
                "round_trip_blocks_equal": same, "agree": agreeing_prefix(mcont, lcont), "kl_first_step": kl(mstep, lstep)}
            print(pair, rec["llama_to_mlx"][pair], rec["mlx_to_llama"][pair], file=sys.stderr, flush=True)
        for src, dst in REQUANT:
            tag = f"{src}->{dst}"
            sess = d / f"{src.replace('/', '-')}.bin"
            pc, out = d / "rq.safetensors", d / "rq.bin"
            first, step, cont = llama_decode(src, None, save=d / "ref.bin")
            s = session_to_prompt_cache(sess, pc, gguf, kv=dst)
            mstep, mcont = mlx_decode(load_prompt_cache(pc), first)
            prompt_cache_to_session(pc, out, gguf)
            _, lstep, lcont = llama_decode(dst, first, load=out)
            rec["requantize"][tag] = {
                "prompt_cache_bytes": pc.stat().st_size, "kv_block_bytes": s["kv_bytes"],
                "session_file_bytes": out.stat().st_size,
                "mlx_agree": agreeing_prefix(cont, mcont), "mlx_kl_first_step": kl(step, mstep),
                "llama_agree": agreeing_prefix(cont, lcont), "llama_kl_first_step": kl(step, lstep)}
            print(tag, rec["requantize"][tag], file=sys.stderr, flush=True)
    write_record(args.out, rec, hardware="cpu", command=rec["script"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
