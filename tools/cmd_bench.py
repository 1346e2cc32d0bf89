"""``tqbridge bench attention``, ``tqbridge bench decode`` and ``tqbridge bench serve``.

``serve``: batched decode through mlx-lm's BatchGenerator, B sequences per batch, TQCache against mlx-lm's
fp16 batch cache, and the sequences a KV budget holds (:mod:`tqbridge.metal.lm.serve_bench`).

``decode``: end-to-end greedy decode through mlx-lm with TQCache against mlx-lm's own fp16 cache (and
its QuantizedKVCache where MLX's backend runs it), per model geometry and context; see
:mod:`tqbridge.metal.lm.decode_bench` for what is measured and how.

``attention``: the fused decode-attention kernel against MLX's paths, side by side, per context length
(:mod:`tqbridge.metal.attention.bench` measures; this module parses and checks the arguments).
Needs MLX on a GPU (CUDA or Metal); ``--backend cpu-emulator`` runs the same steps on the CPU as a
smoke test.
"""

from __future__ import annotations

import json

from tqbridge.bridge.blocks.kv_spec import DEFAULT_FORMAT, Q_PRECISION_EXAMPLE, TURBO_FORMAT

from .cli import CliError

DEFAULT_TUNE = "tiles:4x128,tiles:2x64,tiles:1x32"   # tiles alternatives: fixed threadgroup sizes (warps x keys per tile)
DEFAULT_CONTEXTS, SERVE_CONTEXTS = "4096,32768,131072", "4096,32768"
DECODE_MODELS, SERVE_MODELS = "qwen2.5-1.5b,llama-3.1-8b,llama-3.2-1b", "llama-3.1-8b"
DECODE_CACHES, SERVE_CACHES = "fp16,q8_0/turbo3,q8_0/q4_0,mlx-q8", "fp16,q8_0/turbo3,q8_0/q4_0"


def add_arguments(p):
    p.add_argument("what", choices=["attention", "decode", "serve"], help="what to benchmark: the attention kernel "
                   "alone, decode end to end through mlx-lm, or batched decode through mlx-lm's BatchGenerator")
    p.add_argument("--context", "--contexts", dest="context", default=None, help="comma-separated context lengths "
                   f"(default {DEFAULT_CONTEXTS}; serve: {SERVE_CONTEXTS})")
    p.add_argument("--models", default=None,
                   help="decode, serve: comma-separated model geometries (random fp16 weights: qwen2.5-1.5b, llama-3.1-8b, "
                        "llama-3.2-1b, llama-3.1-70b-8l, gemma-3-270m, tiny) or real models (smollm2, gemma3, a GGUF "
                        f"path); default {DECODE_MODELS} (serve: {SERVE_MODELS})")
    p.add_argument("--batches", default="1,8,32", help="serve: comma-separated numbers of sequences per batch")
    p.add_argument("--budget-gb", type=float, default=40.0, help="serve: the KV memory budget whose concurrent "
                   "sequences are counted (GB, 1e9 bytes)")
    p.add_argument("--memory-gb", type=float, default=None, help="serve: device memory; runs that would not fit are "
                   "not run (default: what MLX reports for the device; none on a CPU)")
    p.add_argument("--caches", default=None,
                   help=f"decode, serve: comma-separated caches (default {DECODE_CACHES}; serve: {SERVE_CACHES}): "
                        "fp16 (mlx-lm KVCache), mlx-q8 / mlx-q4 (mlx-lm "
                        "QuantizedKVCache), or TQCache K/V spellings; fp16 first (speed-ups are against it); a "
                        "TQCache may carry decode options in braces, e.g. 'q8_0/turbo3{compile=0}' (docs/settings.md), "
                        "to compare them in one process, the q precision among them: "
                        f"'{Q_PRECISION_EXAMPLE}' ('@' only names a format variant); per-layer pairs in brackets: "
                        "'q8_0/turbo3[0,-1=q8_0/q8_0]'")
    p.add_argument("--tokens", type=int, default=32, help="decode: tokens generated per cache and round")
    p.add_argument("--rounds", type=int, default=3, help="decode: interleaved rounds (every cache decodes in each)")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"],
                   help="decode: the model's dtype (weights, activations, K/V rows); on a CPU float32 is faster")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--k-format", default=DEFAULT_FORMAT)
    p.add_argument("--v-format", default=TURBO_FORMAT)
    p.add_argument("--layers", type=int, default=16, help="distinct layers chained per evaluation")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--kernel", default="auto,tiles", help="comma-separated pass-1 kernels to time with their default "
                   "plan (auto: the backend's default for the pair, as a cache runs it; int8-mma: matrix fragments, "
                   "int8 q; tiles: a tile at a time, one key per thread; lanes: lanes share a key); the first is the "
                   "headline")
    p.add_argument("--tune", default=DEFAULT_TUNE, help="extra kernel configs, e.g. 'tiles:8x64,int8-mma:4x64x1,lanes:16x4x64' "
                   "(tiles / int8-mma: warps x keys per tile, int8-mma then optionally x 16-key chunks per step; lanes: "
                   "lanes_per_key x warps [x tile]; no prefix: lanes; '' for none)")
    p.add_argument("--splits", type=int, default=None, help="force the number of context splits")
    p.add_argument("--regime", default="fixed,growing", help="attention: fixed (the same length every call) and/or "
                   "growing (a new length every evaluation, as a decoding loop calls it; also times the prepared "
                   "launch a TQCache runs, as cache_path)")
    p.add_argument("--backend", default="auto", choices=["auto", "cuda", "metal", "cpu-emulator"],
                   help="attention: where the kernels run (cpu-emulator: the same steps on the CPU emulator, a smoke "
                        "test of the command, no timing worth reading)")
    p.add_argument("--no-device-time", action="store_true", help="attention: skip the device time per call (CUPTI "
                   "through PyTorch's profiler, summed over the kernels each evaluation ran)")
    p.add_argument("--variants", default=None, help="attention: settings of the cache path to compare within this "
                   "process, in interleaved rounds with fp16 SDPA timed in each round (ratios free of the run-to-run "
                   "spread between processes): ';'-separated variants, each ','-separated decode options name=value "
                   "(docs/settings.md), an empty one for the defaults; e.g. 'chunks=1;' (growing length)")
    p.add_argument("--variant-rounds", type=int, default=2, help="attention: rounds of --variants (default 2)")
    p.add_argument("--json", default=None, help="write the results to this file")
    p.add_argument("--markdown", default=None, help="decode: write the results as a Markdown table here (tokens/s, "
                   "the ratio to fp16, the decode phase's peak memory, KV bytes, the plan that ran)")


def parse_variants(spec: "str | None") -> list:
    """``--variants``: a list of DecodeOptions (the defaults for an empty variant)."""
    if spec is None:
        return []
    from ..metal.profiling import SettingsError, parse_options

    try:
        out = [parse_options(part) for part in spec.split(";")]
    except SettingsError as e:
        raise CliError(f"--variants: {e}") from None
    if len(out) < 2:
        raise CliError("--variants: at least two variants, ';'-separated (an empty one for the defaults)")
    return out


def run(args) -> int:
    serve = args.what == "serve"
    args.context = args.context or (SERVE_CONTEXTS if serve else DEFAULT_CONTEXTS)
    args.models = args.models or (SERVE_MODELS if serve else DECODE_MODELS)
    args.caches = args.caches or (SERVE_CACHES if serve else DECODE_CACHES)
    if serve:
        return _run_serve(args)
    if args.what == "decode":
        return _run_decode(args)
    return _run_attention(args)


def _cache_kinds(spec: str, mlx_lm_caches) -> list[str]:
    """``--caches`` split at its top-level commas, each checked: one of ``mlx_lm_caches`` (mlx-lm's own) or a
    TQCache spelling, which may carry decode options in braces (``q8_0/turbo3{fold_append=0}``)."""
    from ..bridge import FormatError
    from ..bridge.blocks.kv_spec import parse_layered_kv_spec, split_top
    from ..metal.profiling import SettingsError, split_options

    try:
        caches = split_top(spec)
        split = [split_options(c) for c in caches]
    except (FormatError, SettingsError) as e:
        raise CliError(f"--caches: {e}") from None
    for c, (b, opts) in zip(caches, split):
        if b in mlx_lm_caches:
            if opts.changed():
                raise CliError(f"--caches: {c!r}: decode options apply to TQCache spellings, not {b}")
            continue
        try:
            parse_layered_kv_spec(b)
        except FormatError as e:
            raise CliError(f"--caches: {e}") from None
    return caches


def _run_serve(args) -> int:
    try:
        import mlx.core as mx
        import mlx_lm  # noqa: F401
    except ImportError as e:
        raise CliError(f"needs mlx and mlx-lm: {e}")
    from ..metal.lm import serve_bench

    caches = _cache_kinds(args.caches, ("fp16",))
    if not caches or caches[0] != "fp16":
        raise CliError("--caches: fp16 first (the ratios are against it), then TQCache pairs")
    try:
        contexts = [int(x) for x in args.context.split(",") if x]
        batches = [int(x) for x in args.batches.split(",") if x]
    except ValueError:
        raise CliError("--contexts / --batches: comma-separated lists of integers") from None
    if not contexts or not batches or min(contexts + batches) < 1:
        raise CliError("--contexts / --batches: positive integers")
    if args.tokens < 1 or args.rounds < 1 or args.budget_gb <= 0:
        raise CliError("--tokens, --rounds: at least 1; --budget-gb: above 0")
    memory = int(args.memory_gb * 1e9) if args.memory_gb else serve_bench.device_memory()
    command = "tqbridge bench serve " + " ".join(
        f"--{k} {v}" for k, v in (("models", args.models), ("contexts", args.context), ("batches", args.batches),
                                   ("caches", args.caches), ("tokens", args.tokens), ("rounds", args.rounds),
                                   ("budget-gb", f"{args.budget_gb:g}"), ("dtype", args.dtype)))

    def save(results):
        if args.json:
            from ..bridge.atomic import write_atomic

            write_atomic(args.json, json.dumps({"command": command, **results}, indent=2))

    keys = ("model", "cache", "context", "batch", "tokens_per_s", "tokens_per_s_vs_fp16", "decode_peak_bytes",
            "kv_bytes_per_sequence", "batch_cache", "error")
    results = serve_bench.run([m for m in args.models.split(",") if m], contexts, batches, caches, args.tokens,
                              args.rounds, int(args.budget_gb * 1e9), memory_bytes=memory,
                              dtype=getattr(mx, args.dtype),
                              log=lambda row: print(json.dumps({k: row[k] for k in keys if k in row}), flush=True),
                              save=save)
    save(results)
    for b in results["budgets"]:
        print(json.dumps(b), flush=True)
    return 0


def _run_attention(args) -> int:
    try:
        import mlx.core  # noqa: F401
        import mlx_lm  # noqa: F401
    except ImportError as e:
        raise CliError(f"needs mlx and mlx-lm: {e}")
    from ..bridge import FormatError, get_format
    from ..bridge.blocks.padding import padded_dim
    from ..metal.attention.bench import AttentionBench, kernel_configs, run_attention_bench
    from ..metal.attention.problem import AttentionError
    from ..metal.backend import pick_backend

    regimes = [r for r in args.regime.split(",") if r]
    if not regimes or set(regimes) - {"fixed", "growing"}:
        raise CliError(f"--regime: {args.regime!r}; a comma-separated list of fixed and growing")
    try:
        contexts = [int(x) for x in args.context.split(",") if x]
    except ValueError:
        raise CliError(f"--context: {args.context!r} is not a comma-separated list of integers") from None
    if args.repeats < 1 or args.layers < 1:
        raise CliError("--repeats and --layers: at least 1")
    variants = parse_variants(args.variants)
    if variants and (args.variant_rounds < 1 or "growing" not in regimes):
        raise CliError("--variants: needs --variant-rounds >= 1 and the growing regime")
    if any(c <= args.repeats + 2 for c in contexts):
        raise CliError(f"--context: each context must exceed --repeats + 2 ({args.repeats + 2}): the growing "
                       "regime times a new length every evaluation below it")
    try:
        kf, vf = get_format(args.k_format), get_format(args.v_format)
        # rows are zero-padded to whole blocks as TQCache stores them (turbo at head dim 64: 128 values)
        kf.check_length(padded_dim(kf, args.head_dim))
        vf.check_length(padded_dim(vf, args.head_dim))
    except FormatError as e:
        raise CliError(f"--k-format / --v-format / --head-dim: {e}") from None
    try:
        configs = tuple(kernel_configs(args.kernel, args.tune))
    except AttentionError as e:
        raise CliError(str(e)) from None
    backend = pick_backend(args.backend)
    if backend not in ("cuda", "metal") and args.backend == "auto":
        raise CliError("bench attention needs MLX on a GPU (CUDA or Metal); this machine has none "
                       "(--backend cpu-emulator runs the same steps on the emulator: a smoke test, not a timing)")
    bench = AttentionBench(k_format=kf, v_format=vf, contexts=tuple(contexts), regimes=tuple(regimes),
                           configs=configs, backend=backend, batch=args.batch,
                           q_heads=args.q_heads, kv_heads=args.kv_heads, head_dim=args.head_dim, layers=args.layers,
                           repeats=args.repeats, splits=args.splits, device_time=not args.no_device_time,
                           variant_list=tuple(variants), variant_rounds=args.variant_rounds)
    results = run_attention_bench(bench)
    if args.json:
        from ..bridge.atomic import write_atomic

        write_atomic(args.json, json.dumps(results, indent=2))
    return 0


def _run_decode(args) -> int:
    try:
        import mlx.core as mx
        import mlx_lm  # noqa: F401
    except ImportError as e:
        raise CliError(f"needs mlx and mlx-lm: {e}")
    from ..metal.lm import decode_bench

    models = [m for m in args.models.split(",") if m]
    caches = _cache_kinds(args.caches, decode_bench.MLX_LM_CACHES)
    try:
        contexts = [int(x) for x in args.context.split(",") if x]
    except ValueError:
        raise CliError(f"--context: {args.context!r} is not a comma-separated list of integers") from None
    if args.tokens < 4:
        raise CliError("--tokens: at least 4 (the first 2 are dropped as warm-up)")
    if args.rounds < 1:
        raise CliError("--rounds: at least 1")
    keys = ("model", "cache", "context", "tokens_per_s", "ms_per_token", "speedup_vs_fp16", "decode_peak_bytes",
            "decode_peak_over_kv_and_model", "decode_kernel", "kv_path_kernels_per_layer",
            "kv_path_host_syncs_per_step", "host_syncs_per_token", "kv_path_python_us_per_layer", "kv_bytes", "error")

    def log(row):
        print(json.dumps({k: row[k] for k in keys if k in row}), flush=True)

    command = "tqbridge bench decode " + " ".join(
        f"--{k} {v}" for k, v in (("models", args.models), ("context", args.context), ("caches", args.caches),
                                   ("tokens", args.tokens), ("rounds", args.rounds), ("dtype", args.dtype)))

    def save(results):
        if args.json:
            from ..bridge.atomic import write_atomic

            write_atomic(args.json, json.dumps({"command": command, **results}, indent=2))

    from ..bridge.mlx_blas import slow_blas_notice

    slow_blas_notice()  # the models run on MLX's CPU with the bundled reference BLAS: say so, once
    try:
        results = decode_bench.run(models, contexts, caches, args.tokens, args.rounds, log=log, save=save,
                                   dtype=getattr(mx, args.dtype))
    except decode_bench.OutOfDeviceMemory as e:
        raise CliError(f"bench decode: {e}") from None
    save(results)
    if args.markdown:
        from ..bridge.atomic import write_atomic

        write_atomic(args.markdown, decode_bench.to_markdown(results))
    return 0
