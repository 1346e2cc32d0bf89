"""What one block format is: :class:`Format` (a registry entry), :class:`Layout` (the fields of a legacy ggml
block) and :class:`FormatError`, with :func:`refuse_nonfinite`, the refusal the ggml codecs share.

The codec modules (:mod:`.formats_ggml`, :mod:`.iq4_nl`, :mod:`.turbo`) build their entries from these
types; :mod:`.registry` collects the entries into the one table of formats and resolves names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np


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


def refuse_nonfinite(name: str, x: np.ndarray) -> None:
    """FormatError naming the first NaN/inf value: ggml's C result for it is undefined."""
    bad = ~np.isfinite(x)
    if bad.any():
        blk, j = (int(i) for i in np.argwhere(bad)[0])
        raise FormatError(
            f"{name}: value {j} of block {blk} is {x[blk, j]}; non-finite input has no defined "
            f"{name} encoding in ggml (float-to-int of NaN/inf), so tqbridge refuses it")
