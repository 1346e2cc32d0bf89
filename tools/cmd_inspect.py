"""``tqbridge inspect FILE.gguf``: tensors and metadata of a GGUF file, and one decoded block."""

from __future__ import annotations

import json
import os
import sys

from tqbridge.tools.cli import CliError


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


def run(args) -> int:
    from tqbridge.bridge.blocks.blockdump import describe_block
    from tqbridge.bridge.gguf.io import GGUFError, open_gguf
    from tqbridge.bridge.gguf.report import tensor_row, text_report
    from tqbridge.bridge.blocks.format_types import FormatError

    try:
        g = open_gguf(args.file)
        block = describe_block(g, *parse_block_spec(args.block)) if args.block else None
        rows = [tensor_row(t) for t in g.tensors]
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
            print("\n".join(text_report(g, rows, block)))
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into `head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
