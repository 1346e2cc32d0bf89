"""``tqbridge inspect FILE.gguf``: tensors and metadata of a GGUF file, and one decoded block."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

from tqbridge.tools.cli import CliError

_TEXT_WIDTH = 72


def add_arguments(p) -> None:
    p.add_argument("file", help="a GGUF file")
    p.add_argument("--block", metavar="TENSOR[:INDEX]",
                   help="decode one block of TENSOR (INDEX counts blocks over the flattened tensor, "
                        "negative from the end; default 0)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def parse_block_spec(spec: str) -> tuple[str, int]:
    name, sep, idx = spec.rpartition(":")
    if sep and name:
        try:
            return name, int(idx)
        except ValueError:
            pass
    return spec, 0


def _short(v) -> str:
    if isinstance(v, dict) and "length" in v:
        head = ", ".join(_short(x) for x in v.get("head", []))
        return f"[{v['length']} x {v['array_of']}] {head}, ..." if head else f"[{v['length']} x {v['array_of']}]"
    if isinstance(v, list):
        return "[" + ", ".join(_short(x) for x in v) + "]"
    text = json.dumps(v, ensure_ascii=False) if isinstance(v, str) else str(v)
    return text if len(text) <= _TEXT_WIDTH else text[:_TEXT_WIDTH - 3] + "..."


def _table(head: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
    fmt = lambda r: "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return [fmt(head), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows]


def _tensor_row(t) -> dict:
    from tqbridge.bridge.blockdump import registry_format

    f = registry_format(t)
    return {"name": t.name, "type": t.type_name, "format": f.key if f else None, "type_id": t.type_id,
            "shape": list(t.shape), "bytes": t.n_bytes, "offset": t.offset}


def _print_text(g, rows: list[dict], block: "dict | None") -> None:
    order = "little" if g.byte_order == "<" else "big"
    print(f"{g.path}: GGUF v{g.version}, {order} endian, {g.file_size} bytes, {len(g.tensors)} tensors, "
          f"{len(g.metadata)} metadata keys, alignment {g.alignment}, data at {g.data_offset}")
    print()
    print("metadata")
    width = max((len(k) for k in g.metadata), default=0)
    for k, v in g.metadata.items():
        print(f"  {k.ljust(width)}  {_short(v)}")
    print()
    print("tensors (shape in ggml order: ne0 = row length)")
    table = [[r["name"], r["type"], " x ".join(map(str, r["shape"])), str(r["bytes"]), str(r["offset"])] for r in rows]
    for line in _table(["name", "type", "shape", "bytes", "offset"], table, right={3, 4}):
        print("  " + line)
    counts = Counter(r["type"] for r in rows)
    total = sum(r["bytes"] for r in rows)
    print(f"  {len(rows)} tensors, {total} bytes: " + ", ".join(f"{n} {k}" for k, n in counts.most_common()))
    if block is not None:
        print()
        print(f"block {block['block']} of {block['tensor']} ({block['type']}): row {block['row']}, "
              f"columns {block['columns'][0]}..{block['columns'][1] - 1}, file offset {block['file_offset']}")
        print(f"  bytes   {block['bytes']}")
        for k, v in block.get("fields", {}).items():
            if isinstance(v, dict):
                v = f"{v['value']!r} ({v['bits']})"
            print(f"  {k:<7} {v}")
        vals = block["values"]
        print(f"  values  ({block['decoder']})")
        if vals is not None:
            for i in range(0, len(vals), 8):
                print("    " + " ".join(f"{x!r:>12}" if not isinstance(x, float) else f"{x:>12.6g}" for x in vals[i:i + 8]))


def run(args) -> int:
    from tqbridge.bridge.blockdump import describe_block
    from tqbridge.bridge.gguf_io import GGUFError, open_gguf
    from tqbridge.bridge.registry import FormatError

    try:
        g = open_gguf(args.file)
        block = describe_block(g, *parse_block_spec(args.block)) if args.block else None
        rows = [_tensor_row(t) for t in g.tensors]
    except (GGUFError, FormatError) as e:
        raise CliError(str(e)) from None
    except MemoryError:
        raise CliError(f"{args.file}: out of memory while reading it") from None
    except Exception as e:  # noqa: BLE001 - a malformed file must never end in a traceback
        raise CliError(f"{args.file}: cannot be read ({type(e).__name__}: {e})") from None
    try:
        if args.json:
            data = {"file": g.path, "version": g.version, "byte_order": "little" if g.byte_order == "<" else "big",
                    "file_size": g.file_size, "alignment": g.alignment, "data_offset": g.data_offset,
                    "metadata": g.metadata, "tensors": rows}
            if block is not None:
                data["block"] = block
            print(json.dumps(data, indent=1, ensure_ascii=False, allow_nan=True))
        else:
            _print_text(g, rows, block)
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into `head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
