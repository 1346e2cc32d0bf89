"""Golden files made by the TurboQuant fork, so CI checks TQCache and our kernel against it without a build.

``python -m tqbridge.parity.harness.fork_goldens --llama BUILD --out DIR`` runs the fork (a build
directory, see :mod:`tqbridge.bridge.llama.build`) on a short SmolLM2 prompt with F32 weights and
writes ``DIR/<variant>.npz`` holding, per K/V pair and per layer, what the fork's eval callback saw
(:func:`tqbridge.bridge.llama.capture.capture_run`):

- ``{pair}/L{il}/k_rows``, ``v_rows``: the float32 rows the fork quantized into its cache (after RoPE,
  zero-padded to 128 per head for turbo types), in the order written;
- ``k_cache``, ``v_cache``: the fork's cache bytes of those cells, (Hkv, cells, row bytes);
- ``q``: q of the last decode step before the fork rotated it (Hq, D padded), ``out``: the fork's
  attention output of that step after its inverse rotation (Hq, D), ``scale``; ``q_fa``, ``out_fa``,
  ``mask``: what its flash attention read and wrote at that step (rotated where the fork rotates);

plus ``{pair}/logits_top_ids`` / ``logits_top`` (the fork's largest :data:`TOP_LOGITS` logits at each
evaluation's last position: the prompt's, then each decode step's) and ``tokens``.
A ``PROVENANCE`` string records the build, its commit, the flags and the command. No code of the fork
is in the files: they are measurements.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

PAIRS = ("q8_0/turbo3", "turbo4/turbo4")
PROMPT_TOKENS = 8
DECODE_STEPS = 2
TOP_LOGITS = 64


def golden_tokens(gguf_path: str, n: int) -> "list[int]":
    from tqbridge.parity.harness.level_logits import parity_text
    from tqbridge.parity.harness.runtimes import LlamaCppRuntime

    return LlamaCppRuntime(gguf_path).tokenize(parity_text()[0])[:n]


def make_goldens(gguf_path: str, pairs=PAIRS, *, n_tokens: int = PROMPT_TOKENS + DECODE_STEPS,
                 decode: int = DECODE_STEPS) -> dict[str, np.ndarray]:
    """The arrays of one variant's file; the build must be selected already."""
    from tqbridge.bridge.llama.side import selected
    from tqbridge.bridge.llama.capture import capture_run

    info = selected()
    if info is None or not info.variant:
        raise SystemExit("fork goldens need a TurboQuant fork build: --llama BUILD")
    from tqbridge.bridge.blocks.kv_spec import qualify_variant, split_kv
    from tqbridge.parity.harness.level_cache import gguf_head_dim

    tokens = golden_tokens(gguf_path, n_tokens)
    out: dict[str, np.ndarray] = {"tokens": np.asarray(tokens, np.int32),
                                  "head_dim": np.int32(gguf_head_dim(gguf_path))}
    for pair in pairs:
        k, v = (qualify_variant(x, info.variant) for x in split_kv(pair))
        cap, res = capture_run(gguf_path, tokens, k, v, decode=decode, rotation=False, n_threads=2)
        key = pair.replace("/", "-")
        lg = res["last_logits"].astype(np.float32)          # (evaluations, vocab)
        top = np.argsort(-lg, axis=1, kind="stable")[:, :TOP_LOGITS]
        out[f"{key}/logits_top_ids"] = top.astype(np.int32)
        out[f"{key}/logits_top"] = np.take_along_axis(lg, top, axis=1)
        for il in sorted(cap.layers):
            L = cap.layers[il]
            cells = np.concatenate(L.k_cells)
            p = f"{key}/L{il}/"
            out[p + "k_rows"] = np.concatenate(L.k_rows).astype(np.float32)
            out[p + "v_rows"] = np.concatenate(L.v_rows).astype(np.float32)
            out[p + "k_cache"] = np.ascontiguousarray(L.k_cache[:, cells])
            out[p + "v_cache"] = np.ascontiguousarray(L.v_cache[:, cells])
            q = (L.q_in[-1].reshape(L.out[-1].shape[0], L.out[-1].shape[1], -1) if L.q_turbo else L.q[-1])
            o = L.out_turbo[-1] if L.out_turbo else L.out[-1]
            out[p + "q"] = np.asarray(q[-1], np.float32)
            out[p + "out"] = np.asarray(o[-1], np.float32)
            out[p + "scale"] = np.float32(L.scale)
            # what the fork's flash attention itself read and wrote at that step: q (rotated and padded
            # for a turbo K), the mask row over the written cells, the output (rotated for a turbo V)
            out[p + "q_fa"] = np.asarray(L.q[-1][-1], np.float32)
            out[p + "out_fa"] = np.asarray(L.out[-1][-1], np.float32)
            out[p + "mask"] = np.asarray(L.mask[-1][-1][cells], np.float32)
    return out


def main(argv: "list[str] | None" = None) -> int:
    from tqbridge.bridge.gguf.f32 import cached_f32_gguf
    from tqbridge.bridge.llama.build import select
    from tqbridge.bridge.gguf.models import model_path

    ap = argparse.ArgumentParser(prog="python -m tqbridge.parity.harness.fork_goldens")
    ap.add_argument("--llama", required=True, metavar="BUILD", help="a TurboQuant fork build directory")
    ap.add_argument("--out", required=True, help="directory for <variant>.npz")
    ap.add_argument("--model", default="smollm2")
    args = ap.parse_args(argv)
    info = select(args.llama)
    f32 = cached_f32_gguf(model_path(args.model))
    arrays = make_goldens(str(f32))
    r = info.report
    arrays["PROVENANCE"] = np.array(json.dumps({
        "variant": info.variant, "model": f"{args.model} (F32 copy of the bundled GGUF)",
        "source_commit": r.get("commit"), "ggml_version": r.get("ggml_version"),
        "cmake_args": (r.get("recipe") or {}).get("cmake_args"),
        "command": "python -m tqbridge.parity.harness.fork_goldens --llama BUILD --out DIR"
                   + (f" --model {args.model}" if args.model != "smollm2" else ""),
        "flash_attn": True, "kv_rotation": False, "threads": 2,
        "pairs": list(PAIRS), "prompt_tokens": PROMPT_TOKENS, "decode_steps": DECODE_STEPS}))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{info.variant}.npz"
    np.savez_compressed(path, **arrays)
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
