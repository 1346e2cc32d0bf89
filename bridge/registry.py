"""The format registry: every block format tqbridge speaks, by name.

A format is addressed as ``name`` (its default variant) or ``name@variant``. Each entry knows its
block size (values per block), type size (bytes per block), bits per value, the ggml type id it has
in each runtime or fork where it exists, and the codec class that implements it.

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

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


class FormatError(ValueError):
    """Unknown format, bad shape or malformed blocks; the message says which."""


@dataclass(frozen=True)
class Layout:
    """Named fields of one of ggml's legacy 32-value blocks (ggml-common.h ``block_q8_0`` …
    ``block_iq4_nl``): an fp16 scale ``d``, an fp16 minimum ``m`` or none, then the codes;
    :mod:`.legacy_fields` splits and joins blocks by it."""

    bits: int             # bits of one code
    has_m: bool           # stores a minimum m (x = d*q + m) instead of a fixed code offset
    offset: int           # code offset for the symmetric types (x = d*(q - offset)); 0 if has_m
    signed: bool = False  # q8_0 stores int8 codes
    values: tuple[int, ...] | None = None  # the value each code stands for, where codes index a table
    values_name: str = ""                  # that table's name in ggml's C (e.g. kvalues_iq4nl)

    @property
    def affine(self) -> bool:
        """Whether a code maps to its value as ``d*code + bias`` (MLX's affine quantization)."""
        return self.values is None


@dataclass(frozen=True)
class Format:
    name: str                       # the base name, e.g. q8_0, turbo3
    variant: str | None             # e.g. "fork-pr197"; None for formats with one variant
    kind: str                       # "float" | "ggml" | "turbo"
    block_size: int                 # values per block
    type_size: int                  # bytes per block
    codec: Any = field(repr=False, compare=False)
    type_ids: Mapping[str, int] = field(default_factory=dict, compare=False)  # runtime/fork -> ggml type id
    description: str = field(default="", compare=False)
    extension: bool = False         # a tqbridge extension no other runtime reads
    # --- facts other modules derive their tables from (None / False: the format lacks it) ---
    # the kernels' format id: TQA_<NAME> of metal/kernels/attention_kernel.h (decode) and, for the formats
    # encoded one by one, QA_<NAME> of metal/kernels/quantize_append.h (encode); the same for every variant
    kernel_id: int | None = field(default=None, compare=False)
    # quantize options that give the bytes llama.cpp writes into its KV cache (iq4_nl: no scale search),
    # and the append kernel's id of that encoder (QA_<NAME>_REF) where it is not the default one
    cache_options: Mapping[str, Any] = field(default_factory=dict, compare=False)
    cache_kernel_id: int | None = field(default=None, compare=False)
    llama_kv: bool = field(default=False, compare=False)     # llama.cpp takes it as a KV cache type (type_k/type_v)
    # ggml-cpu's flash_attn_ext over a llama.cpp cache of it is what parity/harness/llama_arith.py reproduces
    flash_attn: bool = field(default=False, compare=False)
    vec_dot_type: str | None = field(default=None, compare=False)  # ggml-cpu's vec_dot_type: q's type in K.q
    layout: Layout | None = field(default=None, compare=False)     # legacy ggml block fields

    @property
    def ggml_id(self) -> int | None:
        """Its ``enum ggml_type`` value in upstream ggml (None for the formats only forks know)."""
        return self.type_ids.get("ggml")

    @property
    def key(self) -> str:
        """The fully qualified name, ``name@variant`` where there is a variant."""
        return f"{self.name}@{self.variant}" if self.variant else self.name

    @property
    def bits_per_value(self) -> float:
        return self.type_size * 8 / self.block_size

    @property
    def compression_vs_f16(self) -> float:
        return 16.0 / self.bits_per_value

    def row_bytes(self, n: int) -> int:
        """Bytes of one row of ``n`` values (``n`` must be a multiple of the block size)."""
        self.check_length(n)
        return n // self.block_size * self.type_size

    def check_length(self, n: int) -> None:
        if n <= 0 or n % self.block_size:
            raise FormatError(
                f"{self.key}: row length {n} is not a positive multiple of its block size {self.block_size}"
            )


_FORMATS: dict[str, Format] = {}      # key -> Format
_DEFAULT_VARIANT: dict[str, str] = {}  # base name -> default variant
_ORDER: list[str] = []                 # listing order of addressable names


def register(fmt: Format, *, default: bool = False) -> Format:
    if fmt.key in _FORMATS:
        raise FormatError(f"format {fmt.key} registered twice")
    _FORMATS[fmt.key] = fmt
    if fmt.variant is not None and (default or fmt.name not in _DEFAULT_VARIANT):
        _DEFAULT_VARIANT[fmt.name] = fmt.variant
    _ORDER.append(fmt.key)
    return fmt


def _ensure_loaded() -> None:
    # Import the modules that register formats (kept lazy so importing the registry is cheap).
    from . import formats_ggml  # noqa: F401
    try:
        from . import turbo  # noqa: F401
    except ImportError as e:  # pragma: no cover - only while the turbo module is absent
        if "turbo" not in str(e):
            raise


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
