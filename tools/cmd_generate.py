"""``tqbridge generate MODEL.gguf --kv K/V --prompt ...``: stream text through the tqbridge KV cache."""

from __future__ import annotations

import os
import sys
import time

from tqbridge.bridge.blocks.kv_spec import CALIBRATED_KV, EXAMPLE_KV, GENERATE_KV, LAYERED_EXAMPLE_KV

from .cli import CliError


def add_arguments(p) -> None:
    p.add_argument("model", help="GGUF model file, or a model name: smollm2, gemma3")
    p.add_argument("--kv", default=None,
                   help=f"K/V cache formats, e.g. {EXAMPLE_KV} (default {GENERATE_KV}); keys calibrated per channel: "
                        f"{CALIBRATED_KV}; per layer: '{LAYERED_EXAMPLE_KV}' (layers 0, 1 and the last two "
                        f"{GENERATE_KV}, the rest {EXAMPLE_KV})")
    p.add_argument("--max-kv-size", type=int, metavar="N",
                   help="a bounded cache: every layer keeps at most the last N positions (a sliding window, as "
                        "mlx-lm's --max-kv-size, but keeping no leading tokens)")
    p.add_argument("--prompt-cache-file", metavar="FILE",
                   help="start from a saved prompt cache (mlx-lm's save_prompt_cache format, TQCache layers; "
                        "--save-prompt-cache writes one): --prompt continues after its positions, in its pairs")
    p.add_argument("--save-prompt-cache", metavar="FILE",
                   help="write the prompt's cache (every prompt token, before the generated ones) to FILE, a new "
                        "file, for --prompt-cache-file (and mlx-lm's load_prompt_cache once tqbridge is imported)")
    p.add_argument("--prompt", required=True, help="prompt text ('-' reads standard input)")
    p.add_argument("--max-tokens", type=int, default=100, help="tokens to generate (default 100)")
    p.add_argument("--temp", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument("--seed", type=int, default=0, help="random seed for sampling")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as one user turn of the model's chat template")
    p.add_argument("--rotation", choices=["llama", "none"], default="llama",
                   help="Hadamard-rotate K/V rows of ggml quantized formats as llama.cpp does (default), or not")
    p.add_argument("--sliding", choices=["quantize", "float"], default="quantize",
                   help="sliding-window layers: quantized like the rest, or mlx-lm's float rotating cache")
    p.add_argument("--decode", choices=["auto", "kernel", "reference"], default="auto",
                   help="decode attention: auto (fused kernel on a GPU), kernel, or the ops reference")
    p.add_argument("--stats", action="store_true", help="print cache paths, bytes and peak memory at the end")


def resolve_model(name: str) -> str:
    """A GGUF path from a path or a model name (``tqbridge.bridge.gguf.models``); a CliError otherwise."""
    from tqbridge.bridge.gguf.models import ModelUnavailable, model_path

    try:
        return str(model_path(name))
    except (ModelUnavailable, FileNotFoundError) as e:
        raise CliError(str(e)) from e


def chat_prompt(path: str, text: str) -> str:
    """The GGUF's chat template applied to one user message (llama-cpp-python's formatter)."""
    from tqbridge.bridge.llama.compat import ensure_compatible

    ensure_compatible()
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    template = llm.metadata.get("tokenizer.chat_template")
    if not template:
        raise CliError(f"{path}: the GGUF has no chat template; drop --chat")
    fmt = Jinja2ChatFormatter(template, eos_token="", bos_token="")
    return fmt(messages=[{"role": "user", "content": text}]).prompt


def run(args) -> int:
    from tqbridge.bridge.mlx_blas import prefer_fast_blas

    prefer_fast_blas()  # before MLX is imported: OpenBLAS for float32 matmuls on Linux CPUs
    import mlx.core as mx

    from tqbridge.bridge import FormatError
    from tqbridge.bridge.gguf.model import GGUFModelError, load_gguf_model
    from tqbridge.bridge.gguf.tokenizer import ChatTokenizer
    from tqbridge.metal.lm.cache import make_layered_cache
    from tqbridge.bridge.blocks.kv_spec import parse_layered_kv_spec
    from tqbridge.metal.lm.report import cache_report, paths_line
    from tqbridge.metal.lm.routing import route_attention

    if args.max_tokens < 0:
        raise CliError(f"--max-tokens must be >= 0, got {args.max_tokens}")
    if args.max_kv_size is not None and args.max_kv_size < 1:
        raise CliError(f"--max-kv-size must be >= 1, got {args.max_kv_size}")
    if args.prompt_cache_file and args.max_kv_size is not None:
        raise CliError("--max-kv-size and --prompt-cache-file: the file's layers hold their own windows; drop "
                       "--max-kv-size")
    if args.prompt_cache_file and args.kv:
        raise CliError("--kv and --prompt-cache-file: the file's layers hold their own pairs; drop --kv")
    if args.save_prompt_cache:
        if not args.save_prompt_cache.endswith(".safetensors"):
            raise CliError(f"{args.save_prompt_cache}: a prompt cache file name ends in .safetensors")
        if os.path.exists(args.save_prompt_cache):
            raise CliError(f"{args.save_prompt_cache}: already exists; choose a new file name")
        if args.max_tokens < 1:
            raise CliError("--save-prompt-cache needs --max-tokens >= 1 (the last prompt token enters the cache "
                           "with the first generated one)")
    try:
        kv = parse_layered_kv_spec(args.kv or GENERATE_KV)
    except FormatError as e:
        raise CliError(str(e)) from e
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    args.model = resolve_model(args.model)
    try:
        model, _ = load_gguf_model(args.model)
    except GGUFModelError as e:
        raise CliError(str(e)) from e
    tok = ChatTokenizer(args.model)
    if args.chat:
        prompt = chat_prompt(args.model, prompt)
    if args.prompt_cache_file:
        cache = _load_cache(args.prompt_cache_file, model)
        kv_name = "from " + os.path.basename(args.prompt_cache_file)
    else:
        try:
            cache = make_layered_cache(model, kv, sliding=args.sliding, rotation=args.rotation,
                                       max_kv_size=args.max_kv_size)
        except FormatError as e:   # a layer index out of range for this model, or named twice
            raise CliError(str(e)) from e
        kv_name = kv.name
    start = max((getattr(c, "offset", 0) for c in cache), default=0)
    ids = tok.encode(prompt, add_bos=start == 0)
    mx.random.seed(args.seed)
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    n_gen, pending, t_first = 0, b"", None
    mem = {}

    def prefill_done():
        mem["prefill_peak"] = mx.get_peak_memory()
        mem["prefill_cache"] = cache_report(cache)["used_nbytes"]
        mx.reset_peak_memory()

    with route_attention(args.decode):
        for token in generate_tokens(model, ids, cache, args.max_tokens, args.temp,
                                     on_prefill_done=prefill_done):
            if t_first is None:
                t_first = time.perf_counter()
                if args.save_prompt_cache:   # the cache holds every prompt token now, no generated one
                    _save_cache(args.save_prompt_cache, cache, args.model, start + len(ids))
            if token in tok.eos_token_ids:
                break
            n_gen += 1
            pending += tok.decode_bytes([token])
            text, pending = _utf8_prefix(pending)
            sys.stdout.write(text)
            sys.stdout.flush()
    sys.stdout.write(pending.decode("utf-8", errors="replace") + "\n")
    t1 = time.perf_counter()
    for c in cache:   # decode steps record NaN/inf on the device; read once, here
        if hasattr(c, "check_finite"):
            try:
                c.check_finite()
            except FormatError as e:
                raise CliError(str(e)) from None
    print(f"--- {paths_line(cache)}", file=sys.stderr)   # which paths ran, any fallback: always
    if args.stats:
        rep = cache_report(cache)
        prefill = (t_first or t1) - t0
        rate = (n_gen - 1) / (t1 - t_first) if t_first and n_gen > 1 else float("nan")
        print(f"--- kv {kv_name}: prompt {len(ids)} tokens ({prefill:.2f} s), generated {n_gen} "
              f"({rate:.1f} tok/s)", file=sys.stderr)
        print(f"--- layers {rep['layer_kinds']}, paths {rep['paths']}", file=sys.stderr)
        mib = 2 ** 20
        print(f"--- cache {rep['used_nbytes'] / mib:.2f} MiB used ({rep['used_nbytes'] / max(1, cache[0].offset):.0f} "
              f"bytes/token), {rep['nbytes'] / mib:.2f} MiB allocated; peak memory: prefill "
              f"{mem.get('prefill_peak', 0) / mib:.1f} MiB, decode {mx.get_peak_memory() / mib:.1f} MiB; "
              f"active {mx.get_active_memory() / mib:.1f} MiB", file=sys.stderr)
    return 0


def _load_cache(path: str, model) -> list:
    """A saved prompt cache for ``model`` (tqbridge's checked loader); CliError with one line otherwise."""
    from tqbridge.bridge import FormatError
    from tqbridge.metal.lm.cache import layer_count
    from tqbridge.metal.lm.prompt_cache import load_prompt_cache

    try:
        cache = load_prompt_cache(path)
    except (ValueError, FormatError) as e:   # PromptCacheError, a TQCache state refused
        raise CliError(str(e) if str(e).startswith(str(path)) else f"{path}: {e}") from None
    n = layer_count(model)
    if len(cache) != n:
        raise CliError(f"{path}: {len(cache)} cache layers; the model has {n}")
    return cache


def _save_cache(path: str, cache: list, model: str, tokens: int) -> None:
    """The cache as mlx-lm's ``save_prompt_cache`` writes it (TQCache layers), written atomically."""
    from mlx_lm.models.cache import save_prompt_cache

    from tqbridge.bridge.atomic import atomic_output

    with atomic_output(path, suffix=".safetensors") as tmp:
        save_prompt_cache(str(tmp), cache, metadata={"tqbridge_model": os.path.basename(model),
                                                     "tokens": str(tokens)})


def _utf8_prefix(b: bytes) -> tuple[str, bytes]:
    """Decode the longest complete UTF-8 prefix of ``b``; keep an unfinished character for later."""
    for cut in range(len(b), max(-1, len(b) - 4), -1):
        try:
            return b[:cut].decode("utf-8"), b[cut:]
        except UnicodeDecodeError:
            continue
    return b.decode("utf-8", errors="replace"), b""


def generate_tokens(model, ids, cache, max_tokens: int, temp: float = 0.0, prefill_step: int = 512,
                    on_prefill_done=None):
    """Yield generated token ids: chunked prefill, then one token per step (greedy or sampled).

    ``on_prefill_done()`` is called once the prompt (all but its last token) is in the cache.
    """
    import mlx.core as mx

    if not ids:
        raise CliError("the prompt encodes to no tokens")
    if max_tokens == 0:
        return
    x = mx.array(ids)[None]
    for s in range(0, x.shape[1] - 1, prefill_step):
        model(x[:, s:min(s + prefill_step, x.shape[1] - 1)], cache=cache)
        mx.eval([a for c in cache for a in (getattr(c, 'keys', None), getattr(c, 'values', None))
                 if a is not None])
    if on_prefill_done is not None:
        on_prefill_done()
    y = x[:, -1:]
    for _ in range(max_tokens):
        logits = model(y, cache=cache)[:, -1, :]
        if temp > 0:
            nxt = mx.random.categorical(logits * (1.0 / temp))
        else:
            nxt = mx.argmax(logits, axis=-1)
        mx.eval(nxt)
        t = int(nxt.item())
        yield t
        y = nxt.reshape(1, 1)
