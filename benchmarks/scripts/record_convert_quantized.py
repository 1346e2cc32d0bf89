"""Measure `tqbridge convert MODEL --to mlx DIR` (quantized, the default) against `--dequantize` and write
one JSON record (docs/conversions.md quotes it).

    .venv/bin/python benchmarks/scripts/record_convert_quantized.py OUT.json [--models smollm2,gemma3] [--tokens 128]

Per model: both conversions (wall time, directory bytes vs the GGUF's bytes); the peak resident memory
(``VmHWM`` of /proc/self/status) of a fresh process that loads each directory with mlx-lm's loader
(``mlx_lm.utils.load_model``, what ``mlx_lm.load`` does before the tokenizer) and evaluates its
parameters, beside the same process that only imports MLX and mlx-lm (the baseline), and MLX's own count
of the memory it holds (``mx.get_active_memory``); and logits over
the first N tokens of the project's evaluation text, one prompt pass, f16 KV cache in llama.cpp and
mlx-lm's own float cache in MLX:

- ``quantized_vs_float``: the quantized directory vs the float one, both in mlx-lm (the weights are the
  same values: what is left is MLX's quantized matmul against its float matmul);
- ``llama_vs_quantized`` / ``llama_vs_float``: llama.cpp (CPU, flash attention, f16 cache) on the same
  GGUF vs each MLX directory. llama.cpp quantizes activations inside its quantized-weight matmuls, so
  these are not zero; ``tqbridge parity --exact-weights`` is the exact-weight comparison.

For Gemma 3 both MLX models get the two llama.cpp details tqbridge's loader applies
(``match_llama_cpp``: float32 embedding scale, ggml's GELU table), so they differ from llama.cpp only
in the weights' matmuls.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record_env import header, write_record

_LOAD = r"""
import json, resource, sys
from pathlib import Path
from tqbridge.bridge.mlx_blas import prefer_fast_blas
prefer_fast_blas()
import mlx.core as mx
from mlx_lm.utils import load_model
if sys.argv[1] != "-":
    model, _ = load_model(Path(sys.argv[1]))
    mx.eval(model.parameters())
else:
    mx.eval(mx.zeros((4,)))
try:   # this process's own peak (ru_maxrss would include the parent's resident set at fork time)
    hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
except OSError:
    hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
# MB = 10**6 bytes, as the directory and GGUF sizes
print(json.dumps({"peak_rss_mb": round(hwm * 1024 / 1e6, 1), "mlx_active_mb": round(mx.get_active_memory() / 1e6, 1)}))
"""


def _load_memory(path: str) -> dict:
    p = subprocess.run([sys.executable, "-c", _LOAD, path], capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def _convert(model: str, out: Path, dequantize: bool) -> dict:
    cmd = ["tqbridge", "convert", model, "--to", "mlx", str(out)] + (["--dequantize"] if dequantize else [])
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "tqbridge.tools.cli", *cmd[1:]], capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    size = sum(f.stat().st_size for f in out.iterdir())
    shown = cmd[:5] + ["DIR"] + cmd[6:]
    return {"command": " ".join(shown),
            "wall_s": round(wall, 1), "dir_bytes": size}


def _mlx_logits(path: Path, ids: "list[int]", arch: str):
    import mlx.core as mx
    import numpy as np
    from mlx_lm.utils import load_model

    from tqbridge.bridge.gguf import model as gguf_model

    model, cfg = load_model(path)
    if arch == "gemma3":
        gguf_model._use_float32_embedding_scale(model, cfg["hidden_size"])
        gguf_model._use_ggml_gelu(model)
    out = model(mx.array([ids]))[0].astype(mx.float32)
    return np.array(out)


def _metrics(p, q) -> dict:
    from tqbridge.parity.harness.metrics import compare_logits

    m = compare_logits(p, q)
    return {k: (float(v) if k != "positions" else int(v)) for k, v in m.items() if k != "kl_per_position"}


def run_model(model: str, tokens: int, tmp: Path) -> dict:
    from tqbridge.bridge.gguf.models import model_path
    from tqbridge.parity.harness.level_logits import parity_text
    from tqbridge.parity.harness.runtimes import KV, LlamaCppRuntime

    src = model_path(model)
    qdir, fdir = tmp / f"{model}-q", tmp / f"{model}-f"
    rec: dict = {"gguf": src.name, "gguf_bytes": src.stat().st_size}
    rec["quantized"] = _convert(model, qdir, dequantize=False)
    rec["float"] = _convert(model, fdir, dequantize=True)
    for k in ("quantized", "float"):
        rec[k]["dir_vs_gguf"] = round(rec[k]["dir_bytes"] / rec["gguf_bytes"], 3)
    cfg = json.loads((qdir / "config.json").read_text())
    placed: dict[str, int] = {}
    for v in cfg["tqbridge"]["placed"].values():
        placed[v] = placed.get(v, 0) + 1
    rec["placed"] = placed
    rec["why_float32"] = cfg["tqbridge"]["why_float32"]
    rec["load_memory"] = {"baseline (imports only)": _load_memory("-"),
                          "quantized": _load_memory(str(qdir)), "float": _load_memory(str(fdir))}
    llama = LlamaCppRuntime(src)
    ids = llama.tokenize(parity_text()[0])[:tokens]
    arch = cfg["model_type"].split("_")[0]
    L = llama.logits(ids, KV.parse("f16"))
    Q = _mlx_logits(qdir, ids, arch)
    F = _mlx_logits(fdir, ids, arch)
    rec["logits"] = {"tokens": len(ids), "llama_cache": "f16/f16", "mlx_cache": "mlx-lm default (float32)",
                     "quantized_vs_float": _metrics(F, Q), "llama_vs_quantized": _metrics(L, Q),
                     "llama_vs_float": _metrics(L, F)}
    return rec


def main(argv: "list[str] | None" = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args(argv)
    record = {**header(("tqbridge", "mlx", "mlx-lm", "gguf", "llama_cpp_python", "numpy")),
              "script": f"benchmarks/scripts/record_convert_quantized.py --models {args.models} --tokens {args.tokens} OUT.json",
              "models": {}}
    with tempfile.TemporaryDirectory(prefix="tqbridge-convert-record-") as tmp:
        for model in args.models.split(","):
            print(f"{model} ...", file=sys.stderr, flush=True)
            record["models"][model] = run_model(model, args.tokens, Path(tmp))
            print(json.dumps(record["models"][model], indent=1), file=sys.stderr, flush=True)
    write_record(args.out, record, hardware="cpu", command=record["script"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
