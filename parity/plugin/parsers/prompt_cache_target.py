"""The ``prompt-cache`` parser target: prompt caches of TQCache layers saved by mlx-lm's
``save_prompt_cache`` (safetensors), a structure-aware edit (hostile saved strings, lying shapes,
dtypes and offsets, edited class tables), and the consumers ``load`` (tqbridge's checked loader),
``use`` (what a loaded cache is for) and ``mlx-lm-load`` (mlx-lm's own loader)."""

from __future__ import annotations

import functools
import json
import random
import struct
from pathlib import Path

from .target import ParserTarget, Seed, write_input


# Format spellings come from the registry (every base name, every name@variant of the turbo default,
# a name no format has, a variant that does not exist) and the named defaults of bridge/blocks/kv_spec.py.


@functools.cache
def _hostile_strings() -> "tuple[str, ...]":
    from tqbridge.bridge.blocks.kv_spec import TURBO_FORMAT
    from tqbridge.bridge.blocks.registry import all_formats

    names = tuple(dict.fromkeys(f.name for f in all_formats()))
    turbo = tuple(f.key for f in all_formats() if f.name == TURBO_FORMAT and f.variant)
    return ("", " ", "-1", "0", "1", "7", "-7", "2147483648", "4294967296", "9223372036854775808",
            "99999999999999999999999", "1e9", "1e400", "nan", "inf", "0x10", "1_000", " 3 ", "3\n",
            *names, *turbo, "q9_9", f"{TURBO_FORMAT}@nope",
            "llama", "none", "mean", "mean+scale", "scale=0", "scale=2", "qscale", "+", "/",
            "TQCache", "\u00e9", "\x00", "9" * 4000)
_DTYPES = ("uint8", "int8", "int32", "uint32", "float32", "float16", "bfloat16", "bool", "int64", "uint64",
           "complex64")
_ST_DTYPE = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "U32": "uint32",
             "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16", "BF16": "bfloat16",
             "F32": "float32", "F64": "float64", "C64": "complex64"}
_ST_CODE = {v: k for k, v in _ST_DTYPE.items()}


def _st_split(data: bytes) -> "tuple[dict, bytes] | None":
    """A safetensors file's JSON header and data section, or None when it does not parse."""
    if len(data) < 8:
        return None
    n = struct.unpack_from("<Q", data, 0)[0]
    if n > len(data) - 8:
        return None
    try:
        head = json.loads(data[8:8 + n])
    except ValueError:
        return None
    return (head, data[8 + n:]) if isinstance(head, dict) else None


def _st_join(head: dict, body: bytes) -> bytes:
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + body


def _st_tensors(head: dict, body: bytes) -> dict:
    out = {}
    for k, v in head.items():
        if k == "__metadata__" or not isinstance(v, dict):
            continue
        try:
            a, b = v["data_offsets"]
            out[k] = [v["dtype"], list(v["shape"]), body[a:b]]
        except (KeyError, TypeError, ValueError):
            return {}
    return out


def _st_rebuild(meta: "dict | None", tensors: dict, lies: "dict | None" = None) -> bytes:
    head: dict = {}
    if meta is not None:
        head["__metadata__"] = meta
    body = bytearray()
    for k, (dt, shape, raw) in tensors.items():
        head[k] = {"dtype": dt, "shape": shape, "data_offsets": [len(body), len(body) + len(raw)]}
        body += raw
    for k, v in (lies or {}).items():
        head.setdefault(k, {}).update(v)
    return _st_join(head, bytes(body))


def _prompt_cache_mutation(rng: random.Random, data: bytes, seed: Seed) -> tuple[bytes, str]:
    """A structure-aware edit of a saved prompt cache: a hostile saved string, a lying shape, dtype or
    offset, an edited class list or scalar-type table, a tensor removed or added."""
    import numpy as np

    split = _st_split(data)
    if split is None:
        return data, "structured edit of an unparsable file (skipped)"
    head, body = split
    meta = head.get("__metadata__") if isinstance(head.get("__metadata__"), dict) else None
    tensors = _st_tensors(head, body)
    if not tensors:
        return data, "structured edit of an unparsable file (skipped)"
    names = sorted(tensors)
    strings = [k for k in names if tensors[k][0] == "I32" and len(tensors[k][1]) == 1]
    r = rng.random()
    if r < 0.40 and strings:
        k = rng.choice(strings)
        s = rng.choice(_hostile_strings())
        codes = [ord(c) for c in s]
        if rng.random() < 0.15:
            codes.append(rng.choice((-1, 0x110000, 2**31 - 1, 0xD800)))
        tensors[k] = ["I32", [len(codes)], np.array(codes, "<i4").tobytes()]
        return _st_rebuild(meta, tensors), f"string {k} = {s[:40]!r}{'+bad code' if len(codes) != len(s) else ''}"
    if r < 0.62:
        k = rng.choice(names)
        dt, shape, raw = tensors[k]
        how = rng.randrange(6)
        if how == 0 and shape:
            shape = shape[:-1]
        elif how == 1:
            shape = shape + [1]
        elif how == 2 and shape:
            i = rng.randrange(len(shape))
            shape = shape[:i] + [rng.choice((0, 1, 2, 3, 2**31, 2**32 + 1, 2**62))] + shape[i + 1:]
        elif how == 3:
            dt = rng.choice(list(_ST_DTYPE))
        elif how == 4 and raw:
            raw = raw[:rng.randrange(len(raw))]
        else:
            return _st_rebuild(meta, tensors, {k: {"shape": [rng.choice((0, 1, 2**31, 2**40))] * rng.randrange(1, 5)}}), \
                f"tensor {k} shape lies about its bytes"
        tensors[k] = [dt, shape, raw]
        return _st_rebuild(meta, tensors), f"tensor {k} -> {dt} {shape} ({len(raw)} bytes)"
    if r < 0.70:
        k = rng.choice(names)
        a = rng.choice((0, 1, 2**31, 2**63, len(body), len(body) + 1))
        b = rng.choice((0, 1, a + 1, 2**32, 2**63 + 5, len(body)))
        return _st_rebuild(meta, tensors, {k: {"data_offsets": [a, b]}}), f"tensor {k} data_offsets [{a}, {b}]"
    if r < 0.80 and meta:
        keys = sorted(meta)
        k = rng.choice(keys)
        v = rng.choice(("TQCache", "KVCache", "QuantizedKVCache", "RotatingKVCache", "Nope", "__class__",
                        "string", "scalar", "none", "bogus", "", "0", "1", "99"))
        meta = dict(meta)
        meta[k] = v
        return _st_rebuild(meta, tensors), f"metadata {k} = {v!r}"
    if r < 0.86 and meta:
        meta = dict(meta)
        k = rng.choice(sorted(meta))
        del meta[k]
        return _st_rebuild(meta, tensors), f"metadata {k} removed"
    if r < 0.93:
        k = rng.choice(names)
        del tensors[k]
        return _st_rebuild(meta, tensors), f"tensor {k} removed"
    k = rng.choice(names)
    parts = k.split(".")
    parts[-1] = str(rng.choice((int(parts[-1]) + 1 if parts[-1].isdigit() else 0, 99, 2**31)))
    new = ".".join(parts)
    tensors[new] = list(tensors[k])
    return _st_rebuild(meta, tensors), f"tensor {new} added (copy of {k})"


class PromptCacheTarget(ParserTarget):
    name = "prompt-cache"
    consumers = ("load", "use", "mlx-lm-load")
    depends = {"use": "load"}
    upstream = True
    suffix = ".safetensors"
    structured_share = 0.5

    def __init__(self):
        self.structured_mutation = _prompt_cache_mutation

    def seeds(self, scratch: Path) -> list[Seed]:
        import mlx.core as mx
        from mlx_lm.models.cache import save_prompt_cache

        from tqbridge.bridge.blocks.kv_spec import CALIBRATED_KV, EXAMPLE_KV, LLAMA_EXAMPLE_KV, split_key_spec, split_kv
        from tqbridge.bridge.blocks.registry import names
        from tqbridge.metal.lm.cache import TQCache

        # from the named pairs and the registry: the example pair, a K format with a minimum over f16
        # with a window, calibrated keys, and an empty cache with the fewest-bits turbo V
        ek, ev = split_kv(EXAMPLE_KV)
        mk = names(lambda f: f.layout is not None and f.layout.has_m)[0]
        ck_side, cv = split_kv(CALIBRATED_KV)
        ck, kcal = split_key_spec(ck_side)
        lv = split_kv(LLAMA_EXAMPLE_KV)[1]
        tv = names(lambda f: f.kind == "turbo")[0]
        mx.random.seed(0)
        made = {}
        for name, (kf, vf, window, cal, d, steps) in {
            f"{ek}-{ev}": (ek, ev, None, None, 64, (5, 1)),
            f"{mk}-f16-window": (mk, "f16", 8, None, 32, (6, 1, 1)),
            f"{ck}+{kcal.spec}-{cv}": (ck, cv, None, kcal, 64, (4,)),
            f"empty-{lv}-{tv}": (lv, tv, 16, None, 64, ()),
        }.items():
            layers = []
            for _ in range(2):
                c = TQCache(kf, vf, window=window, calibration=cal)
                for s in steps:
                    c.update_and_fetch(mx.random.normal((1, 2, s, d)), mx.random.normal((1, 2, s, d)))
                layers.append(c)
            p = scratch / f"{name}.safetensors"
            save_prompt_cache(str(p), layers, metadata={"kv": f"{kf}/{vf}"})
            made[name] = p.read_bytes()
            p.unlink()
        out = []
        for name, data in made.items():
            head, body = _st_split(data)
            at = len(data) - len(body)
            fields = []   # the character codes of every saved string (offset, head dims, formats, ...)
            for k, (dt, shape, raw) in _st_tensors(head, body).items():
                if dt == "I32" and len(shape) == 1:
                    a = head[k]["data_offsets"][0]
                    fields += [(at + a + 4 * j, 4) for j in range(shape[0])]
            out.append(Seed(name, data, fields, at))
        return out

    def clean_classes(self, consumer):
        return (ValueError,)

    def raised_by_us_required(self, consumer):
        return True

    def call(self, consumer, data, scratch):
        path = write_input(scratch, data, self.suffix)
        if consumer == "mlx-lm-load":           # mlx-lm's own loader (TQCache registered with it)
            from mlx_lm.models.cache import load_prompt_cache

            import tqbridge.metal.lm.cache  # noqa: F401

            load_prompt_cache(str(path))
            return None
        from tqbridge.metal.lm.prompt_cache import load_prompt_cache as checked

        caches = checked(path)
        return _use_caches(caches) if consumer == "use" else None


def _use_caches(caches) -> "str | None":
    """What a loaded prompt cache is for: read it back, fetch it, continue it by one step, save it."""
    import mlx.core as mx

    from tqbridge.metal.lm.cache import TQCache

    for c in caches:
        if not isinstance(c, TQCache):
            continue
        st = c.state
        c.nbytes
        c.make_mask(1)
        if c.keys is not None:
            k, v = c.fetch()
            mx.eval(k, v)
            B, H = c.keys.shape[0], c.keys.shape[1]
        else:
            B, H = 1, 2
        kd, vd = c.k_dim or 64, c.v_dim or 64
        try:
            step = mx.zeros((B, H, 1, kd)), mx.zeros((B, H, 1, vd))
        except (ValueError, RuntimeError, OverflowError, TypeError) as e:
            return f"accepted a state no decode step can follow (K/V rows of {kd}/{vd} values: {type(e).__name__})"
        k, v = c.update_and_fetch(*step)
        mx.eval(k, v)
        c.trim(1)
        TQCache.from_state(st)
    return None
