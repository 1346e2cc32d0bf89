"""Float formats and ggml's legacy block formats.

The numpy reference reuses gguf-py's ``gguf.quants`` wherever it is bit-exact with ggml's C
(quantize and dequantize of q8_0, q4_0, q4_1, q5_0, q5_1, bf16; dequantize of iq4_nl); tqbridge
writes only what gguf-py lacks (the iq4_nl quantizer, in :mod:`.iq4_nl`). Type ids are ggml's
``enum ggml_type`` values (``gguf.GGMLQuantizationType``), the same in upstream llama.cpp and the
TurboQuant forks for these types.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from .registry import Format, register


class F32:
    """One float32 per block (ggml ``GGML_TYPE_F32``)."""

    @staticmethod
    def quantize_blocks(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x, dtype="<f4").view(np.uint8)

    @staticmethod
    def dequantize_blocks(b: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(b).view("<f4").astype(np.float32)


class F16:
    """One IEEE half per block, round to nearest even (ggml ``GGML_TYPE_F16``)."""

    @staticmethod
    def quantize_blocks(x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return np.ascontiguousarray(x, dtype=np.float32).astype("<f2").view(np.uint8)

    @staticmethod
    def dequantize_blocks(b: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(b).view("<f2").astype(np.float32)


class _GgufCodec:
    """Delegates to the gguf-py class for ``qtype`` (bit-exact with ggml's C reference)."""

    qtype: T

    @classmethod
    def quantize_blocks(cls, x: np.ndarray) -> np.ndarray:
        impl = gq._type_traits[cls.qtype]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return impl.quantize_blocks(np.ascontiguousarray(x, dtype=np.float32))

    @classmethod
    def dequantize_blocks(cls, b: np.ndarray) -> np.ndarray:
        impl = gq._type_traits[cls.qtype]
        return impl.dequantize_blocks(np.ascontiguousarray(b, dtype=np.uint8)).astype(np.float32, copy=False)


def _gguf_codec(qtype: T) -> type:
    return type(f"{qtype.name}Codec", (_GgufCodec,), {"qtype": qtype})


def _sizes(qtype: T) -> tuple[int, int]:
    from gguf.constants import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[qtype]


def _ggml(name: str, qtype: T, codec: type, kind: str, description: str) -> Format:
    block_size, type_size = _sizes(qtype)
    return register(Format(
        name=name, variant=None, kind=kind, block_size=block_size, type_size=type_size,
        codec=codec, type_ids={"ggml": int(qtype)}, description=description,
    ))


def _register_all() -> None:
    from .iq4_nl import IQ4NL

    _ggml("f32", T.F32, F32, "float", "IEEE float32")
    _ggml("f16", T.F16, F16, "float", "IEEE float16 (round to nearest even)")
    _ggml("bf16", T.BF16, _gguf_codec(T.BF16), "float", "bfloat16 (round to nearest even, NaN kept quiet)")
    _ggml("q8_0", T.Q8_0, _gguf_codec(T.Q8_0), "ggml", "fp16 d + 32 int8 (x = d*q)")
    _ggml("q4_0", T.Q4_0, _gguf_codec(T.Q4_0), "ggml", "fp16 d + 32 4-bit (x = d*(q-8))")
    _ggml("q4_1", T.Q4_1, _gguf_codec(T.Q4_1), "ggml", "fp16 d, m + 32 4-bit (x = d*q + m)")
    _ggml("q5_0", T.Q5_0, _gguf_codec(T.Q5_0), "ggml", "fp16 d + 32 5-bit (x = d*(q-16))")
    _ggml("q5_1", T.Q5_1, _gguf_codec(T.Q5_1), "ggml", "fp16 d, m + 32 5-bit (x = d*q + m)")
    _ggml("iq4_nl", T.IQ4_NL, IQ4NL, "ggml", "fp16 d + 32 4-bit indices into a fixed non-linear table")


_register_all()
