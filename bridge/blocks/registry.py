"""The format registry: every block format tqbridge speaks, by name.

A format is addressed as ``name`` (its default variant) or ``name@variant``. Each entry knows its
block size (values per block), type size (bytes per block), bits per value, the ggml type id it has
in each runtime or fork where it exists, and the codec class that implements it. The entries
(:class:`.format_types.Format`) come from the codec modules, :mod:`.formats_ggml` and :mod:`.turbo`,
which know nothing of this table.

The entry is the one table of per-format facts: the kernels' format id, whether llama.cpp takes the
format as a KV cache type and runs ggml's flash attention on it, ggml's ``vec_dot_type`` for it, the
named fields of a legacy ggml block. Every other per-format table (``FORMAT_IDS`` of the attention
kernel, ``LLAMA_KV_TYPES``, ``VEC_DOT_TYPE``, the affine formats, …) is derived from these entries
with :func:`names` and :func:`kernel_ids`; docs/adding-a-format.md lists the steps of a new format.

Codec classes follow gguf-py's ``quants.py`` shape: class methods working on whole blocks,

    quantize_blocks(x: (n_blocks, block_size) float32) -> (n_blocks, type_size) uint8
    dequantize_blocks(b: (n_blocks, type_size) uint8, **options) -> (n_blocks, block_size) float32

and, when MLX is available, ``mlx_quantize_blocks`` / ``mlx_dequantize_blocks`` with the same
contract on ``mlx.core`` arrays (byte-identical to the numpy reference).
"""

from __future__ import annotations

import threading
from typing import Callable

from .format_types import Format, FormatError

_FORMATS: dict[str, Format] = {}      # key -> Format
_DEFAULT_VARIANT: dict[str, str] = {}  # base name -> default variant
_ORDER: list[str] = []                 # listing order of addressable names
_LOADED = False
_LOADING = threading.Lock()


def register(fmt: Format, *, default: bool = False) -> Format:
    if fmt.key in _FORMATS:
        raise FormatError(f"format {fmt.key} registered twice")
    _FORMATS[fmt.key] = fmt
    if fmt.variant is not None and (default or fmt.name not in _DEFAULT_VARIANT):
        _DEFAULT_VARIANT[fmt.name] = fmt.variant
    _ORDER.append(fmt.key)
    return fmt


def _ensure_loaded() -> None:
    # Register the codec modules' entries on first use (imported here, so importing the registry is cheap).
    global _LOADED
    if _LOADED:
        return
    with _LOADING:
        if _LOADED:
            return
        from . import formats_ggml
        from . import turbo

        for fmt in formats_ggml.FORMATS:
            register(fmt)
        for fmt in turbo.FORMATS:
            register(fmt, default=fmt.variant == turbo.DEFAULT_VARIANT)
        _LOADED = True


def shown(text: str, limit: int = 60) -> str:
    """``repr`` of user text for an error message, shortened past ``limit`` characters (a hostile
    spelling must not make a one-line error megabytes long)."""
    text = str(text)
    return repr(text[:limit]) + (f"... ({len(text)} characters)" if len(text) > limit else "")


def get_format(name: "str | Format") -> Format:
    """Resolve ``name`` or ``name@variant`` to its :class:`Format`; a clear error otherwise."""
    if isinstance(name, Format):
        return name
    _ensure_loaded()
    if not isinstance(name, str):
        raise FormatError(f"format must be a name, got {type(name).__name__}")
    key = name.strip().lower()
    if key in _FORMATS:
        return _FORMATS[key]
    base, _, variant = key.partition("@")
    if not variant and base in _DEFAULT_VARIANT:
        return _FORMATS[f"{base}@{_DEFAULT_VARIANT[base]}"]
    known = ", ".join(formats())
    if variant:
        variants = sorted(f.variant for f in _FORMATS.values() if f.name == base and f.variant)
        if variants:
            raise FormatError(f"unknown variant {shown(variant)} of {base}; known variants: {', '.join(variants)}")
    raise FormatError(f"unknown format {shown(name)}; known formats: {known}")


def formats() -> list[str]:
    """Every addressable format name: ``name`` for a default variant, ``name@variant`` otherwise."""
    _ensure_loaded()
    out = []
    for key in _ORDER:
        fmt = _FORMATS[key]
        if fmt.variant is not None and _DEFAULT_VARIANT.get(fmt.name) == fmt.variant:
            out.append(fmt.name)
        else:
            out.append(key)
    return out


def all_formats() -> list[Format]:
    _ensure_loaded()
    return [_FORMATS[k] for k in _ORDER]


def names(where: Callable[[Format], bool]) -> tuple[str, ...]:
    """The names users type (:func:`display_name`) of the formats for which ``where(format)`` holds,
    in registry order; e.g. ``names(lambda f: f.llama_kv)``."""
    return tuple(display_name(f) for f in all_formats() if where(f))


def kernel_ids() -> dict[str, int]:
    """Format name -> the kernels' format id (``TQA_<NAME>`` in metal/kernels/attention_kernel.h), for every
    format the kernels decode, in registry order (all variants of a name share the id)."""
    out: dict[str, int] = {}
    for f in all_formats():
        if f.kernel_id is None:
            continue
        if out.setdefault(f.name, f.kernel_id) != f.kernel_id:
            raise FormatError(f"{f.key}: kernel id {f.kernel_id}, but another variant of {f.name} has {out[f.name]}")
    return out


def display_name(fmt: "str | Format") -> str:
    """The short name users type for ``fmt`` (``turbo3`` for the default variant)."""
    fmt = get_format(fmt)
    if fmt.variant is not None and _DEFAULT_VARIANT.get(fmt.name) == fmt.variant:
        return fmt.name
    return fmt.key
