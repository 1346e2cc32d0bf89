"""``tqbridge formats``: the registry as a table (or JSON)."""

from __future__ import annotations

import json

from tqbridge.bridge import all_formats, display_name


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def rows() -> list[dict]:
    out = []
    for f in all_formats():
        out.append({
            "name": display_name(f),
            "format": f.name,
            "variant": f.variant,
            "kind": f.kind,
            "block_values": f.block_size,
            "block_bytes": f.type_size,
            "bits_per_value": round(f.bits_per_value, 4),
            "compression_vs_f16": round(f.compression_vs_f16, 3),
            "type_ids": dict(f.type_ids),
            "extension": f.extension,
        })
    return out


def run(args) -> int:
    data = rows()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    head = ["name", "variant", "values", "bytes", "bits/value", "vs f16", "type ids"]
    table = [[r["name"], r["variant"] or "-", str(r["block_values"]), str(r["block_bytes"]),
              f"{f.bits_per_value:.3f}", f"{f.compression_vs_f16:.2f}x",   # unrounded: no double rounding
              ", ".join(f"{k}={v}" for k, v in r["type_ids"].items()) or "(tqbridge only)"]
             for f, r in zip(all_formats(), data)]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    print("  ".join("-" * w for w in widths))
    for t in table:
        print("  ".join(c.ljust(w) for c, w in zip(t, widths)))
    return 0
