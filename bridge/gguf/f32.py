"""Exact-weights GGUF: every tensor dequantized to F32 (gguf-py), all metadata kept.

llama.cpp quantizes activations inside matmuls with quantized weights; on an F32 copy of the same
weights both runtimes compute with identical values, so only the KV cache and the kernels differ.
Writes are atomic (temporary file + rename) and never replace the input.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..atomic import atomic_output
from ..environ import cache_dir
from .model import GGUFModelError, dequantize_tensor, open_reader

# gguf-py's LlamaFileType value for "all F32" (llama.h: LLAMA_FTYPE_ALL_F32 = 0).
_FTYPE_ALL_F32 = 0


def file_sha256(path: "str | os.PathLike[str]") -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def write_f32_gguf(src: "str | os.PathLike[str]", dst: "str | os.PathLike[str]") -> Path:
    """Write ``dst``: ``src`` with every tensor as F32. Returns ``dst``."""
    import gguf

    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise GGUFModelError(f"{src}: no such file")
    if _same_file(src, dst):
        raise GGUFModelError(f"{dst}: refusing to overwrite the input file")
    reader = open_reader(src)
    fld = reader.fields.get("general.architecture")
    arch = None
    if fld is not None and fld.types == [gguf.GGUFValueType.STRING]:
        try:
            arch = fld.contents()
        except UnicodeDecodeError:   # GGUF strings are UTF-8; gguf-py decodes strictly
            arch = None
    if not isinstance(arch, str):
        raise GGUFModelError(f"{src.name}: general.architecture is missing or not a UTF-8 string")
    with atomic_output(dst) as tmp:
        writer = gguf.GGUFWriter(tmp, arch)
        for key, fld in reader.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":
                continue  # written by GGUFWriter itself
            vtype = fld.types[0]
            if key == "general.file_type":
                writer.add_key_value(key, _FTYPE_ALL_F32, vtype)
                continue
            sub = fld.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            try:
                value = fld.contents()
            except UnicodeDecodeError:
                raise GGUFModelError(f"{src.name}: metadata {key[:60]!r} holds a string that is not UTF-8 "
                                     "(GGUF strings are UTF-8; gguf-py cannot copy it)") from None
            if vtype == gguf.GGUFValueType.ARRAY and (not value or sub == gguf.GGUFValueType.ARRAY):
                # gguf-py's writer refuses empty arrays and writes no nested ones
                raise GGUFModelError(f"{src.name}: metadata {key[:60]!r} is an empty or nested array, "
                                     "which gguf-py cannot write")
            writer.add_key_value(key, value, vtype, sub_type=sub)
        if "general.file_type" not in reader.fields:
            writer.add_file_type(_FTYPE_ALL_F32)
        for t in reader.tensors:
            writer.add_tensor(t.name, dequantize_tensor(t, src.name))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return dst


def cached_f32_gguf(src: "str | os.PathLike[str]") -> Path:
    """The F32 copy of ``src`` in the cache (converted on first use, keyed by the input's sha256)."""
    src = Path(src)
    digest = file_sha256(src)[:16]
    dst = cache_dir() / "f32" / f"{src.stem}.{digest}.f32.gguf"
    if not dst.exists():
        write_f32_gguf(src, dst)
    return dst
