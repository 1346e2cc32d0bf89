"""One block of a GGUF tensor, decoded: its named fields and its values (for ``tqbridge inspect``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .format_types import FormatError
from ..gguf.io import GGUFError, GGUFFile, TensorInfo
from .legacy_fields import split_blocks
from .registry import all_formats

_INT_TYPES = {"I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8", "F64": "<f8"}


def registry_format(t: TensorInfo):
    """The tqbridge format of a GGUF tensor type (by ggml type id), or None."""
    for f in all_formats():
        if f.type_ids.get("ggml") == t.type_id and f.variant is None:
            return f
    return None


def _f16(v: np.float16) -> dict[str, Any]:
    return {"value": float(v), "bits": f"0x{int(np.array(v, dtype='<f2').view('<u2')):04x}"}


def _plain(v):
    """JSON-safe: non-finite floats become the strings "nan", "inf", "-inf"."""
    return v if not isinstance(v, float) or np.isfinite(v) else str(v)


def describe_block(g: GGUFFile, name: str, index: int) -> dict[str, Any]:
    """Fields and decoded values of block ``index`` of tensor ``name``."""
    t = g.tensor(name)
    if g.byte_order != "<":
        raise GGUFError(f"{g.path}: decoding blocks of a big-endian GGUF file is not supported (the table is)")
    raw = g.block_bytes(name, index)
    index %= t.n_blocks
    per_row = t.shape[0] // t.block_size if t.shape else 1
    row, col = divmod(index, per_row)
    out: dict[str, Any] = {
        "tensor": name, "type": t.type_name, "block": index, "row": row,
        "columns": [col * t.block_size, (col + 1) * t.block_size], "file_offset": t.offset + index * t.type_size,
        "bytes": raw.hex(),
    }
    b = np.frombuffer(raw, dtype=np.uint8)[None, :]
    fmt = registry_format(t)
    if fmt is not None and fmt.layout is not None:
        fields = split_blocks(fmt, b)
        out["fields"] = {"d": _f16(fields["d"][0])}
        if "m" in fields:
            out["fields"]["m"] = _f16(fields["m"][0])
        if "qh" in fields:
            out["fields"]["qh"] = f"0x{int(fields['qh'][0]):08x}"
        out["fields"]["q"] = [int(v) for v in fields["q"][0]]
    if fmt is not None:
        from .api import dequantize

        values = dequantize(fmt, b, fmt.block_size)[0]
        out["decoder"] = "tqbridge"
    elif t.type_name in _INT_TYPES:
        values = np.frombuffer(raw, dtype=_INT_TYPES[t.type_name])
        out["decoder"] = "numpy"
    else:
        try:
            from gguf import GGMLQuantizationType
            from gguf.quants import dequantize as gguf_dequantize

            values = gguf_dequantize(b, GGMLQuantizationType(t.type_id)).reshape(-1)
            out["decoder"] = "gguf-py"
        except (NotImplementedError, FormatError, ValueError) as e:
            out["decoder"] = f"none ({e})"
            values = None
    out["values"] = None if values is None else [_plain(v.item()) for v in np.asarray(values).reshape(-1)]
    return out
