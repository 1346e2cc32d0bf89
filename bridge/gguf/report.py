"""What ``tqbridge inspect FILE.gguf`` shows of a GGUF file: one row per tensor and the text report
(header, metadata, tensor table, and a block described by :func:`tqbridge.bridge.blocks.blockdump.describe_block`)."""

from __future__ import annotations

import json
from collections import Counter

from ..blocks.blockdump import registry_format
from .io import GGUFFile

TEXT_WIDTH = 72     # a metadata value longer than this is cut with "..."


def _short(v) -> str:
    if isinstance(v, dict) and "length" in v:
        head = ", ".join(_short(x) for x in v.get("head", []))
        return f"[{v['length']} x {v['array_of']}] {head}, ..." if head else f"[{v['length']} x {v['array_of']}]"
    if isinstance(v, list):
        return "[" + ", ".join(_short(x) for x in v) + "]"
    text = json.dumps(v, ensure_ascii=False) if isinstance(v, str) else str(v)
    return text if len(text) <= TEXT_WIDTH else text[:TEXT_WIDTH - 3] + "..."


def _table(head: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
    fmt = lambda r: "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return [fmt(head), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows]


def tensor_row(t) -> dict:
    """One tensor of the report: name, ggml type, registry format (or None), id, shape, bytes, offset."""
    f = registry_format(t)
    return {"name": t.name, "type": t.type_name, "format": f.key if f else None, "type_id": t.type_id,
            "shape": list(t.shape), "bytes": t.n_bytes, "offset": t.offset}


def text_report(g: GGUFFile, rows: list[dict], block: "dict | None") -> list[str]:
    """The text report, as lines."""
    out = []
    add = out.append
    order = "little" if g.byte_order == "<" else "big"
    add(f"{g.path}: GGUF v{g.version}, {order} endian, {g.file_size} bytes, {len(g.tensors)} tensors, "
          f"{len(g.metadata)} metadata keys, alignment {g.alignment}, data at {g.data_offset}")
    add("")
    add("metadata")
    width = max((len(k) for k in g.metadata), default=0)
    for k, v in g.metadata.items():
        add(f"  {k.ljust(width)}  {_short(v)}")
    add("")
    add("tensors (shape in ggml order: ne0 = row length)")
    table = [[r["name"], r["type"], " x ".join(map(str, r["shape"])), str(r["bytes"]), str(r["offset"])] for r in rows]
    for line in _table(["name", "type", "shape", "bytes", "offset"], table, right={3, 4}):
        add("  " + line)
    counts = Counter(r["type"] for r in rows)
    total = sum(r["bytes"] for r in rows)
    add(f"  {len(rows)} tensors, {total} bytes: " + ", ".join(f"{n} {k}" for k, n in counts.most_common()))
    if block is not None:
        add("")
        add(f"block {block['block']} of {block['tensor']} ({block['type']}): row {block['row']}, "
              f"columns {block['columns'][0]}..{block['columns'][1] - 1}, file offset {block['file_offset']}")
        add(f"  bytes   {block['bytes']}")
        for k, v in block.get("fields", {}).items():
            if isinstance(v, dict):
                v = f"{v['value']!r} ({v['bits']})"
            add(f"  {k:<7} {v}")
        vals = block["values"]
        add(f"  values  ({block['decoder']})")
        if vals is not None:
            for i in range(0, len(vals), 8):
                add("    " + " ".join(f"{x!r:>12}" if not isinstance(x, float) else f"{x:>12.6g}" for x in vals[i:i + 8]))
    return out
