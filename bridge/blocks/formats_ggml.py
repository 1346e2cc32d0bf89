"""Float formats and ggml's legacy block formats.

The numpy reference reuses gguf-py's ``gguf.quants`` wherever it is bit-exact with ggml's C
(quantize and dequantize of q8_0, q4_0, q4_1, q5_0, q5_1, bf16; dequantize of iq4_nl); tqbridge
writes only what gguf-py lacks (the iq4_nl quantizer, in :mod:`.iq4_nl`). Type ids are ggml's
``enum ggml_type`` values (``gguf.GGMLQuantizationType``), the same in upstream llama.cpp and the
TurboQuant forks for these types.

:data:`FORMATS`, built by :func:`_formats`, is the table of these formats' facts (see
:class:`.format_types.Format`; :mod:`.registry` registers them): the kernels' format id (``TQA_*`` /
``QA_*`` in metal/kernels/*.h, checked by tests/test_registry.py), llama.cpp's KV cache types (its
``kv_cache_types``), the cache types whose ggml-cpu ``flash_attn_ext``
:mod:`tqbridge.parity.harness.llama_arith` reproduces, ggml-cpu's ``vec_dot_type`` (checked against
``ggml_get_type_traits_cpu``) and the legacy block fields.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from .format_types import Format, Layout, refuse_nonfinite
from .iq4_nl import IQ4NL, KVALUES


class F32:
    """One float32 per block (ggml ``GGML_TYPE_F32``)."""

    @staticmethod
    def quantize_blocks(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x, dtype="<f4").view(np.uint8)

    @staticmethod
    def dequantize_blocks(b: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(b).view("<f4").astype(np.float32)


class F16:
    """One IEEE half per block, round to nearest even (ggml ``GGML_TYPE_F16``).

    NaN follows ggml's ``ggml_compute_fp32_to_fp16``: any NaN becomes ``sign | 0x7e00`` (numpy
    would keep payload bits); decoding quiets a signalling NaN as ggml's conversion does.
    """

    @staticmethod
    def quantize_blocks(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            h = x.astype("<f2").view("<u2")
        nan = np.isnan(x)
        if nan.any():
            sign = (x.view(np.uint32) >> 31).astype(np.uint16) << 15
            h = np.where(nan, sign | np.uint16(0x7E00), h).astype("<u2")
        return np.ascontiguousarray(h).view(np.uint8)

    @staticmethod
    def dequantize_blocks(b: np.ndarray) -> np.ndarray:
        h = np.ascontiguousarray(b).view("<u2")
        with np.errstate(invalid="ignore"):
            y = h.view("<f2").astype(np.float32)
        nan = (h & 0x7FFF) > 0x7C00
        if nan.any():
            y = np.where(nan, (y.view(np.uint32) | np.uint32(0x00400000)).view(np.float32), y)
        return y


class _GgufCodec:
    """Delegates to the gguf-py class for ``qtype`` (bit-exact with ggml's C reference, up to the
    sign of zero scales, which :meth:`_fix_zero_signs` sets as C's scans do)."""

    qtype: T
    mlx_name: str

    @classmethod
    def quantize_blocks(cls, x: np.ndarray) -> np.ndarray:
        impl = gq._type_traits[cls.qtype]
        x = np.ascontiguousarray(x, dtype=np.float32)
        if cls.qtype != T.BF16:
            refuse_nonfinite(cls.qtype.name.lower(), x)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out = impl.quantize_blocks(x)
        return cls._fix_zero_signs(x, out)

    @classmethod
    def _fix_zero_signs(cls, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        # gguf-py takes numpy's min/max/argmax, whose zero signs differ from C's first-wins scans:
        # q4_0/q5_0 keep max = +0.0 for an all-zero block (so d = +0.0 / -8 = -0.0); q4_1/q5_1 take
        # min and max as the first element with that value (x[0] for an all-zero block, d = +0.0).
        if cls.qtype in (T.Q4_0, T.Q5_0):
            zero = (np.abs(x) == 0).all(axis=1)
            if zero.any():
                out = out.copy()
                out[zero, 0:2] = (0x00, 0x80)
        elif cls.qtype in (T.Q4_1, T.Q5_1):
            mn = x.min(axis=1, keepdims=True)
            zmin = mn[:, 0] == 0
            if zmin.any():
                out = out.copy()
                first = np.argmax(x == mn, axis=1)
                neg = np.signbit(x[np.arange(x.shape[0]), first])
                out[zmin, 3] = np.where(neg[zmin], out[zmin, 3] | 0x80, out[zmin, 3] & 0x7F)
                allzero = zmin & (x.max(axis=1) == 0)
                out[allzero, 0:2] = 0
        return out

    @classmethod
    def dequantize_blocks(cls, b: np.ndarray) -> np.ndarray:
        impl = gq._type_traits[cls.qtype]
        b = np.ascontiguousarray(b, dtype=np.uint8)
        with np.errstate(invalid="ignore", over="ignore"):
            y = impl.dequantize_blocks(b).astype(np.float32, copy=False)
            if cls.qtype in (T.Q4_1, T.Q5_1):
                # C computes x*d + m; when both x*d and m are NaN, x86-64 returns the first operand's
                # NaN, while numpy's SIMD add may return m's. Recompute those blocks' x*d (m := 0).
                m_nan = (b[:, 2:4].copy().view("<u2")[:, 0] & 0x7FFF) > 0x7C00
                if m_nan.any():
                    bz = b[m_nan].copy()
                    bz[:, 2:4] = 0
                    xd = impl.dequantize_blocks(bz).astype(np.float32, copy=False)
                    y = y.copy()
                    y[m_nan] = np.where(np.isnan(xd), xd, y[m_nan])
        return y


def _mlx_ops(name: str, refuse: bool) -> dict:
    """``mlx_quantize_blocks`` / ``mlx_dequantize_blocks`` for a codec, from :mod:`.mlx_ggml`."""

    def mlx_quantize_blocks(x, check_finite=True, **options):
        import mlx.core as mx

        from . import mlx_ggml

        x = x.astype(mx.float32)
        if refuse and check_finite and not bool(mx.all(mx.isfinite(x)).item()):
            refuse_nonfinite(name, np.array(x))
        return getattr(mlx_ggml, f"{name}_quantize")(x, **options)

    def mlx_dequantize_blocks(b):
        from . import mlx_ggml

        return getattr(mlx_ggml, f"{name}_dequantize")(b)

    return {"mlx_quantize_blocks": staticmethod(mlx_quantize_blocks),
            "mlx_dequantize_blocks": staticmethod(mlx_dequantize_blocks)}


def _with_mlx(cls: type, name: str, refuse: bool) -> type:
    for k, v in _mlx_ops(name, refuse).items():
        setattr(cls, k, v)
    return cls


def _gguf_codec(qtype: T) -> type:
    name = qtype.name.lower()
    cls = type(f"{qtype.name}Codec", (_GgufCodec,), {"qtype": qtype})
    return _with_mlx(cls, name, refuse=qtype != T.BF16)


def _sizes(qtype: T) -> tuple[int, int]:
    from gguf.constants import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[qtype]


def _ggml(name: str, qtype: T, codec: type, kind: str, description: str, **facts) -> Format:
    block_size, type_size = _sizes(qtype)
    return Format(
        name=name, variant=None, kind=kind, block_size=block_size, type_size=type_size,
        codec=codec, type_ids={"ggml": int(qtype)}, description=description, **facts,
    )


def _formats() -> tuple[Format, ...]:
    _with_mlx(F32, "f32", refuse=False)
    _with_mlx(F16, "f16", refuse=False)
    _with_mlx(IQ4NL, "iq4_nl", refuse=True)
    kv = dict(llama_kv=True)             # llama.cpp takes all of these as KV cache types
    fa = dict(kv, flash_attn=True)       # ... and llama_arith reproduces ggml-cpu's flash_attn_ext on these
    return (
        _ggml("f32", T.F32, F32, "float", "IEEE float32", kernel_id=0, vec_dot_type="f32", **kv),
        _ggml("f16", T.F16, F16, "float", "IEEE float16 (round to nearest even)",
              kernel_id=1, vec_dot_type="f16", **fa),
        _ggml("bf16", T.BF16, _gguf_codec(T.BF16), "float", "bfloat16 (round to nearest even, NaN kept quiet)",
              kernel_id=2, vec_dot_type="bf16", **kv),
        _ggml("q8_0", T.Q8_0, _gguf_codec(T.Q8_0), "ggml", "fp16 d + 32 int8 (x = d*q)",
              kernel_id=3, vec_dot_type="q8_0", layout=Layout(bits=8, has_m=False, offset=0, signed=True), **fa),
        _ggml("q4_0", T.Q4_0, _gguf_codec(T.Q4_0), "ggml", "fp16 d + 32 4-bit (x = d*(q-8))",
              kernel_id=4, vec_dot_type="q8_0", layout=Layout(bits=4, has_m=False, offset=8), **fa),
        _ggml("q4_1", T.Q4_1, _gguf_codec(T.Q4_1), "ggml", "fp16 d, m + 32 4-bit (x = d*q + m)",
              kernel_id=5, vec_dot_type="q8_1", layout=Layout(bits=4, has_m=True, offset=0), **fa),
        _ggml("q5_0", T.Q5_0, _gguf_codec(T.Q5_0), "ggml", "fp16 d + 32 5-bit (x = d*(q-16))",
              kernel_id=6, vec_dot_type="q8_0", layout=Layout(bits=5, has_m=False, offset=16), **fa),
        _ggml("q5_1", T.Q5_1, _gguf_codec(T.Q5_1), "ggml", "fp16 d, m + 32 5-bit (x = d*q + m)",
              kernel_id=7, vec_dot_type="q8_1", layout=Layout(bits=5, has_m=True, offset=0), **fa),
        _ggml("iq4_nl", T.IQ4_NL, IQ4NL, "ggml", "fp16 d + 32 4-bit indices into a fixed non-linear table",
              kernel_id=8, vec_dot_type="q8_0", cache_options={"search": False}, cache_kernel_id=10,
              layout=Layout(bits=4, has_m=False, offset=0, values=tuple(int(v) for v in KVALUES),
                            values_name="kvalues_iq4nl"), **fa),
    )


# this module's registry entries, in registry order
FORMATS: tuple[Format, ...] = _formats()
