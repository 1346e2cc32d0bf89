"""Loading saved prompt caches (mlx-lm's ``save_prompt_cache`` files, TQCache layers included) safely.

mlx-lm's ``load_prompt_cache`` trusts the file: a hostile list index in a key (``"0.2147483648"``)
makes ``tree_unflatten`` build a list of two billion entries, an unknown class name is a
``KeyError``, a bad character code a ``ValueError`` from ``chr``, a JSON header that is not UTF-8 a
``UnicodeDecodeError`` — and the bytes of a safetensors file are MLX's to check. :func:`check_prompt_cache`
walks the file first (the safetensors header against the file size, every dtype, shape and data
offset; the key tree; the class and scalar tables) and raises :class:`PromptCacheError` with one
line; :func:`load_prompt_cache` then builds the caches like mlx-lm does. A TQCache layer's state is
checked by ``TQCache``'s own setters (:mod:`tqbridge.metal.lm.cache`).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

__all__ = ["PromptCacheError", "check_prompt_cache", "load_prompt_cache"]

# safetensors dtype -> bytes per element (the names MLX's reader accepts)
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "U32": 4, "I32": 4, "U64": 8, "I64": 8,
                "F16": 2, "BF16": 2, "F32": 4, "F64": 8, "C64": 8}
_INT_DTYPES = {"U8": "<u1", "I8": "<i1", "U16": "<u2", "I16": "<i2", "U32": "<u4", "I32": "<i4", "U64": "<u8",
               "I64": "<i8"}
MAX_HEADER = 100 << 20        # the safetensors format's own limit on the JSON header
_MAX_DEPTH = 16
_SCALAR_TYPES = ("scalar", "string", "none")


class PromptCacheError(ValueError):
    """A file that is not a prompt cache tqbridge can load; one line says why."""


def _shown(text: Any) -> str:
    text = str(text)
    return repr(text[:60]) + (f"... ({len(text)} characters)" if len(text) > 60 else "")


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise PromptCacheError(f"key {_shown(k)} appears twice in the safetensors header")
        out[k] = v
    return out


def _header(path: str) -> "tuple[dict, dict, int, int]":
    """(tensors, metadata, data offset, data size) of a safetensors file, every field checked."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise PromptCacheError(f"{path}: {size} bytes, shorter than a safetensors header (8)")
            n = struct.unpack("<Q", head)[0]
            if n > min(size - 8, MAX_HEADER):
                raise PromptCacheError(f"{path}: the JSON header claims {n} bytes; the file has {size - 8} after "
                                       "the length field")
            raw = f.read(n)
    except OSError as e:
        raise PromptCacheError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except PromptCacheError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise PromptCacheError(f"{path}: the safetensors header is not UTF-8 JSON ({type(e).__name__})") from None
    if not isinstance(doc, dict):
        raise PromptCacheError(f"{path}: the safetensors header is not a JSON object")
    meta = doc.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise PromptCacheError(f"{path}: __metadata__ is not a table of strings")
    data_size = size - 8 - n
    tensors = {}
    for name, t in doc.items():
        where = f"{path}: tensor {_shown(name)}"
        if not isinstance(t, dict) or set(t) != {"dtype", "shape", "data_offsets"}:
            raise PromptCacheError(f"{where} is not a dtype, shape and data_offsets entry")
        dt, shape, offs = t["dtype"], t["shape"], t["data_offsets"]
        if dt not in _DTYPE_BYTES:
            raise PromptCacheError(f"{where} has unknown dtype {_shown(dt)}")
        if not isinstance(shape, list) or len(shape) > 8 or \
                not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 62 for d in shape):
            raise PromptCacheError(f"{where} has a bad shape")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) and not isinstance(o, bool)
                                                                   for o in offs)):
            raise PromptCacheError(f"{where} has bad data_offsets")
        a, b = offs
        count = 1
        for d in shape:
            count *= d
        if not 0 <= a <= b <= data_size or b - a != count * _DTYPE_BYTES[dt]:
            raise PromptCacheError(f"{where}: {dt} {shape} needs {count * _DTYPE_BYTES[dt]} bytes; data_offsets "
                                   f"[{a}, {b}] of {data_size}")
        tensors[name] = (dt, shape, a, b)
    return tensors, meta, 8 + n, data_size


def _tree(flat: dict, what: str, depth: int = 0) -> Any:
    """``mlx.utils.tree_unflatten`` with its list indices bounded by the number of entries (mlx-lm's
    loader fills an index gap with empty dicts: ``"0.2147483648"`` would allocate two billion)."""
    if depth > _MAX_DEPTH:
        raise PromptCacheError(f"{what}: keys nest more than {_MAX_DEPTH} deep")
    if len(flat) == 1 and "" in flat:
        return flat[""]
    children: dict = {}
    for key, value in flat.items():
        head, _, rest = key.partition(".")
        children.setdefault(head, {})[rest] = value
    ints = {}
    for k in children:
        if k.isascii() and k.isdigit() and (k == "0" or not k.startswith("0")):
            ints[int(k)] = k
    if ints and len(ints) != len(children):
        raise PromptCacheError(f"{what}: a level mixes list indices and names ({_shown(sorted(children)[0])})")
    if not ints:
        if any(_looks_int(k) for k in children):
            raise PromptCacheError(f"{what}: key part {_shown(next(k for k in children if _looks_int(k)))} is not "
                                   "a plain list index")
        return {k: _tree(v, what, depth + 1) for k, v in children.items()}
    if max(ints) > 2 * len(ints) + 8:
        raise PromptCacheError(f"{what}: list index {max(ints)} for {len(ints)} entries")
    items: list = []
    for i in sorted(ints):
        items.extend({} for _ in range(i - len(items)))
        items.append(_tree(children[ints[i]], what, depth + 1))
    return items


def _looks_int(k: str) -> bool:
    try:
        int(k)
        return True
    except ValueError:
        return False


def _cache_classes() -> dict:
    from mlx_lm.models import cache as mlx_cache

    from . import cache  # noqa: F401 - registers TQCache where mlx-lm looks classes up

    return {name: obj for name, obj in vars(mlx_cache).items()
            if isinstance(obj, type) and issubclass(obj, mlx_cache._BaseCache) and obj is not mlx_cache._BaseCache}


def check_prompt_cache(path: "str | os.PathLike[str]") -> dict:
    """Check a saved prompt cache without loading its arrays; :class:`PromptCacheError` on the first
    problem. Returns ``{"classes": [...], "metadata": {...}}``."""
    path = os.fspath(path)
    tensors, meta, data_at, _ = _header(path)
    tree = _tree(meta, f"{path}: metadata")
    if not isinstance(tree, list) or len(tree) != 3:
        raise PromptCacheError(f"{path}: metadata is not [user metadata, classes, scalars] as save_prompt_cache writes")
    user, classes, scalars = tree
    if user == {} or user == []:
        user = {}
    if not isinstance(user, dict) or not all(isinstance(v, str) for v in user.values()):
        raise PromptCacheError(f"{path}: the user metadata is not a table of strings")
    known = _cache_classes()
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise PromptCacheError(f"{path}: the class table is not a list of names")
    for c in classes:
        if c not in known:
            raise PromptCacheError(f"{path}: unknown cache class {_shown(c)} (known: {', '.join(sorted(known))})")
    if not isinstance(scalars, list) or not scalars or scalars[0] != "":
        raise PromptCacheError(f"{path}: the scalar table is not as save_prompt_cache writes it")
    for entry in scalars[1:]:
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)):
            raise PromptCacheError(f"{path}: a scalar table entry is not [position, type]")
        pos, kind = entry
        if pos not in tensors:
            raise PromptCacheError(f"{path}: the scalar table names {_shown(pos)}, which the file does not hold")
        if kind not in _SCALAR_TYPES:
            raise PromptCacheError(f"{path}: scalar {_shown(pos)} has unknown type {_shown(kind)}")
        dt, shape, a, b = tensors[pos]
        if kind == "scalar" and (b - a) // _DTYPE_BYTES[dt] != 1:
            raise PromptCacheError(f"{path}: scalar {_shown(pos)} holds {shape}, not one value")
        if kind == "string":
            if dt not in _INT_DTYPES or len(shape) != 1:
                raise PromptCacheError(f"{path}: string {_shown(pos)} is not a 1-D array of character codes")
            import numpy as np

            with open(path, "rb") as f:
                f.seek(data_at + a)
                codes = np.frombuffer(f.read(b - a), _INT_DTYPES[dt])
            if codes.size and (codes.min() < 0 or codes.max() > 0x10FFFF):
                raise PromptCacheError(f"{path}: string {_shown(pos)} holds a code outside Unicode")
    layers = _tree({k: None for k in tensors}, f"{path}: tensor names") if tensors else []
    if not isinstance(layers, list) or len(layers) != len(classes):
        n = len(layers) if isinstance(layers, list) else "no list of"
        raise PromptCacheError(f"{path}: {len(classes)} cache classes for {n} layer states")
    return {"classes": classes, "metadata": user}


def load_prompt_cache(path: "str | os.PathLike[str]", return_metadata: bool = False):
    """:func:`check_prompt_cache`, then what mlx-lm's ``load_prompt_cache`` does: a list of caches
    (and the user metadata). A TQCache layer refuses a bad state with a one-line ``ValueError``; a
    layer of one of mlx-lm's classes that refuses its state gives :class:`PromptCacheError`."""
    import mlx.core as mx

    path = os.fspath(path)
    info = check_prompt_cache(path)
    arrays, meta = mx.load(path, return_metadata=True)
    scalars = _tree(meta, "metadata")[2]
    for pos, kind in scalars[1:]:
        a = arrays[pos]
        if kind == "scalar":
            arrays[pos] = a.item()
        elif kind == "string":
            arrays[pos] = "".join(chr(i) for i in a.tolist())
        else:
            arrays[pos] = None
    states = _tree(arrays, "arrays") if arrays else []
    classes = _cache_classes()
    from .cache import TQCache

    caches = []
    for i, (name, state) in enumerate(zip(info["classes"], states)):
        cls = classes[name]
        if cls is TQCache:
            caches.append(cls.from_state(state))
            continue
        try:
            caches.append(cls.from_state(state))
        except (ValueError, TypeError, IndexError, KeyError, AttributeError) as e:
            raise PromptCacheError(f"{path}: layer {i}: mlx-lm's {name} refuses its state "
                                   f"({type(e).__name__}: {_shown(e)})") from None
    return (caches, info["metadata"]) if return_metadata else caches
