"""GGUF weights as MLX affine quantization, exactly, wherever MLX's layout can hold ggml's values.

MLX's affine quantization (``mx.quantize`` / ``mx.dequantize`` / ``mx.quantized_matmul``, mode
``"affine"``) stores, per group of ``group_size`` consecutive values of a row (32, 64 or 128 in MLX
0.32; group 16 is refused), one ``scale`` and one ``bias`` and unsigned ``bits``-bit codes
(2, 3, 4, 5, 6 or 8) packed into uint32 words; a value is ``scale * code + bias``. A ggml type goes
to MLX blocks when each of its sub-blocks of 32 values decodes as ``a * code + b`` for one ``a`` and
one ``b``:

    q8_0, q4_0, q5_0, q4_1, q5_1   one 32-value block = one group (tqbridge.bridge.blocks.affine)
    q4_k, q5_k                     a 256-value super-block has 8 sub-blocks of 32, each with a 6-bit
                                   scale ``sc`` and a 6-bit minimum ``m`` over fp16 ``d`` and
                                   ``dmin``: value = d*sc*q - dmin*m, so scale = d*sc and
                                   bias = -(dmin*m), group 32, bits 4 or 5

Scales and biases are stored in float32. Why ``mx.dequantize`` then gives gguf-py's float32 values bit
for bit (K-quants; the legacy types are argued in tqbridge.bridge.blocks.affine): d and dmin are fp16 values
(11 significant bits), sc and m below 2**6, so d*sc and dmin*m are exact in float32 (17 bits), and
(d*sc)*q is exact (at most 22 bits). gguf-py (and ggml's dequantize_row_q4_K) then computes
(d*sc)*q - dmin*m with one rounding; MLX computes (d*sc)*q + (-(dmin*m)), and x - y is x + (-y) in
IEEE arithmetic, so the one rounding is the same one (with or without a fused multiply-add, since the
product is exact). float16 or bfloat16 scales could not hold d*sc (17 significant bits).

The other types stay float32 (gguf-py's exact dequantization), each for a reason in
:data:`PLACEMENTS`. That dict is the one table; :func:`placement_table` renders it for the docs.

Facts used, with their source: block layouts from ggml's ggml-common.h (``block_q4_K``:
d, dmin, scales[12], qs[128]; ``block_q5_K``: the same with qh[32] before qs) and the 6-bit scale
packing of ggml-quants.c's ``get_scale_min_k4``; MLX's bit packing (one little-endian bit stream per
row, value 0 in the lowest bits) checked against ``mx.quantize`` by the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..blocks.affine import pack_codes, to_mlx_affine
from ..blocks.format_types import FormatError

QK_K = 256          # values in a K-quant super-block
SUB = 32            # values in a Q4_K/Q5_K sub-block: one MLX group
GROUP_SIZES = (32, 64, 128)   # what mx.quantize accepts in MLX 0.32 (mode "affine")


@dataclass(frozen=True)
class Placement:
    """Where a ggml type's tensors go in a quantized MLX directory."""

    to: str                   # "affine" (MLX quantized layer) or "float32"
    bits: int | None = None   # affine: bits per code
    group_size: int | None = None
    how: str = ""             # the mapping (affine) or why not (float32)


_GROUP16 = ("sub-blocks of 16 values, a scale each; MLX's smallest affine group is 32, and two scales "
            "in one group have no single scale*code + bias")
_TABLE = "its codes index a fixed non-linear table, not an evenly spaced grid"

PLACEMENTS: dict[str, Placement] = {
    "Q8_0": Placement("affine", 8, 32, "scale d, bias -128*d, code q + 128"),
    "Q4_0": Placement("affine", 4, 32, "scale d, bias -8*d, code q"),
    "Q5_0": Placement("affine", 5, 32, "scale d, bias -16*d, code q"),
    "Q4_1": Placement("affine", 4, 32, "scale d, bias m, code q"),
    "Q5_1": Placement("affine", 5, 32, "scale d, bias m, code q"),
    "Q4_K": Placement("affine", 4, 32, "per sub-block of 32: scale d*sc, bias -(dmin*m), code q"),
    "Q5_K": Placement("affine", 5, 32, "per sub-block of 32: scale d*sc, bias -(dmin*m), code q"),
    "Q6_K": Placement("float32", how=_GROUP16),
    "Q3_K": Placement("float32", how=_GROUP16),
    "Q2_K": Placement("float32", how=_GROUP16),
    "F32": Placement("float32", how="already float32"),
    "F16": Placement("float32", how="exact widening; kept float32 so the model computes in float32 "
                                    "as the float path does"),
    "BF16": Placement("float32", how="exact widening; kept float32 so the model computes in float32 "
                                     "as the float path does"),
    "IQ4_NL": Placement("float32", how=_TABLE),
    "IQ4_XS": Placement("float32", how=_TABLE),
    "IQ3_S": Placement("float32", how=_TABLE),
    "IQ3_XXS": Placement("float32", how=_TABLE),
    "IQ2_S": Placement("float32", how=_TABLE),
    "IQ2_XS": Placement("float32", how=_TABLE),
    "IQ2_XXS": Placement("float32", how=_TABLE),
    "IQ1_S": Placement("float32", how=_TABLE),
    "IQ1_M": Placement("float32", how=_TABLE),
    "TQ1_0": Placement("float32", how="ternary d*(q-1) in base-3 packing; an affine 2-bit form exists "
                                      "but is not built"),
    "TQ2_0": Placement("float32", how="ternary d*(q-1); an affine 2-bit form exists but is not built"),
    "MXFP4": Placement("float32", how="e2m1 codes (a non-linear table) under power-of-two scales; MLX's "
                                      "mxfp4 mode is not mapped"),
}
_OTHER = Placement("float32", how="not in the table: dequantized by gguf-py")


def placement(type_name: str) -> Placement:
    """The placement of a ggml type (its gguf-py name, e.g. ``"Q4_K"``); types not in the table: float32."""
    return PLACEMENTS.get(type_name, _OTHER)


def placement_table() -> str:
    """:data:`PLACEMENTS` as a Markdown table (docs/conversions.md quotes it; a test keeps them equal)."""
    rows = ["| ggml type | MLX | bits | group | how, or why not |", "|---|---|---|---|---|"]
    for name, p in PLACEMENTS.items():
        if p.to == "affine":
            rows.append(f"| {name} | affine | {p.bits} | {p.group_size} | {p.how} |")
        else:
            rows.append(f"| {name} | float32 | | | {p.how} |")
    return "\n".join(rows)


# ---- K-quants --------------------------------------------------------------------------------

_KQUANT = {   # type -> (bits, bytes per super-block)
    "Q4_K": (4, 2 + 2 + 12 + QK_K // 2),
    "Q5_K": (5, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
}


def _scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N, 12) packed 6-bit scales and minimums -> (N, 8) sc, (N, 8) m (ggml's get_scale_min_k4).

    Sub-blocks 0-3: the low 6 bits of bytes j (sc) and j+4 (m). Sub-blocks 4-7: the low / high
    nibble of byte j+4 (sc / m) under the top 2 bits of byte j-4 (sc) / byte j (m), as bits 4-5."""
    p = packed.astype(np.uint8)
    lo, mid, hi = p[:, 0:4], p[:, 4:8], p[:, 8:12]
    sc = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 6) << 4)], axis=1)
    m = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return sc, m


def _kquant_fields(type_name: str, blocks: np.ndarray):
    """(N, type_size) super-blocks -> d (N,), dmin (N,) float32; sc, m (N, 8); codes (N, 8, 32) uint8."""
    bits, size = _KQUANT[type_name]
    b = np.ascontiguousarray(blocks, dtype=np.uint8)
    n = b.shape[0]
    d = b[:, 0:2].copy().view("<f2").astype(np.float32).reshape(n)
    dmin = b[:, 2:4].copy().view("<f2").astype(np.float32).reshape(n)
    sc, m = _scales_mins(b[:, 4:16])
    pos = 16
    qh = None
    if bits == 5:
        qh = b[:, pos:pos + QK_K // 8]          # (N, 32): bit j of byte l is bit 4 of value l of sub-block j
        pos += QK_K // 8
    qs = b[:, pos:pos + QK_K // 2].reshape(n, 4, 1, SUB)   # 4 chunks of 32 bytes: sub-blocks 2c (low), 2c+1 (high)
    codes = ((qs >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F).reshape(n, 8, SUB)
    if qh is not None:
        high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
        codes = codes | (high << 4)
    return d, dmin, sc, m, codes


def kquant_to_mlx_affine(type_name: str, blocks, n: int):
    """Q4_K / Q5_K super-blocks (..., row_bytes) of rows of ``n`` values -> ``(w, scales, biases, 32, bits)``.

    ``w`` uint32 (..., n*bits/32), ``scales``/``biases`` float32 (..., n/32), as numpy arrays;
    ``mx.dequantize`` of them equals gguf-py's dequantization bit for bit (module docstring).
    """
    if type_name not in _KQUANT:
        raise FormatError(f"{type_name}: not a K-quant with 32-value sub-blocks (those are {', '.join(_KQUANT)})")
    bits, size = _KQUANT[type_name]
    b = np.asarray(blocks)
    if b.dtype != np.uint8 or b.ndim == 0:
        raise FormatError(f"{type_name}: blocks must be a uint8 array, got {b.dtype} of {b.ndim} axes")
    if n <= 0 or n % QK_K:
        raise FormatError(f"{type_name}: row length {n} is not a positive multiple of {QK_K}")
    if b.shape[-1] != n // QK_K * size:
        raise FormatError(f"{type_name}: a row of {n} values takes {n // QK_K * size} bytes, "
                          f"but the blocks' last axis has {b.shape[-1]}")
    lead = b.shape[:-1]
    d, dmin, sc, m, codes = _kquant_fields(type_name, b.reshape(-1, size))
    scales = d[:, None] * sc.astype(np.float32)             # exact: 11 x 6 significant bits
    biases = -(dmin[:, None] * m.astype(np.float32))        # exact, negated
    groups = n // SUB
    w = pack_codes(codes.reshape(-1, SUB), bits).reshape(*lead, groups * bits)
    return w, scales.reshape(*lead, groups), biases.reshape(*lead, groups), SUB, bits


# ---- one tensor ------------------------------------------------------------------------------

_LEGACY = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q5_0": "q5_0", "Q4_1": "q4_1", "Q5_1": "q5_1"}


def to_mlx_quantized(type_name: str, blocks, n: int):
    """ggml blocks of an affine-placed type -> numpy ``(w, scales, biases, group_size, bits)`` (float32
    scales and biases); :class:`FormatError` for a type :data:`PLACEMENTS` keeps float32."""
    if type_name in _KQUANT:
        return kquant_to_mlx_affine(type_name, blocks, n)
    if type_name in _LEGACY:
        import mlx.core as mx

        w, s, bias, g, bits = to_mlx_affine(_LEGACY[type_name], np.asarray(blocks), n, dtype=mx.float32)
        return np.array(w), np.array(s), np.array(bias), g, bits
    p = placement(type_name)
    raise FormatError(f"{type_name} has no exact MLX affine form: {p.how}")


def dequantize_mlx(w, scales, biases, group_size: int, bits: int) -> np.ndarray:
    """``mx.dequantize`` of an affine triplet (numpy in, float32 numpy out): what MLX computes."""
    import mlx.core as mx

    out = mx.dequantize(mx.array(w), mx.array(scales), mx.array(biases), group_size=group_size, bits=bits)
    return np.array(out.astype(mx.float32) if out.dtype != mx.float32 else out)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two float32 arrays are equal bit for bit (NaN payloads and the sign of zero included)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, except that a zero may have either sign: the one difference MLX's ``scale*code +
    bias`` can show against ggml's symmetric types (d*(q-k) is -0.0 for d < 0 at q = k; the sum of
    two opposite numbers is +0.0). A NaN must match its bits exactly."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    if a.shape != b.shape:
        return False
    if np.array_equal(a.view(np.uint32), b.view(np.uint32)):
        return True
    differ = a.view(np.uint32) != b.view(np.uint32)
    return not (differ & ~((a == 0) & (b == 0))).any()


# ---- a whole model ---------------------------------------------------------------------------

# GGUF tensor kinds that are the weight of an mlx-lm Linear or Embedding (layers with to_quantized)
QUANTIZABLE_KINDS = frozenset({"attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up",
                               "ffn_down", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp", "token_embd",
                               "output"})


@dataclass
class QuantizedWeights:
    """What :func:`quantized_weights` returns: the arrays to save, mlx-lm's ``quantization`` config
    (None when nothing went to MLX blocks), per GGUF tensor where it went (``"Q4_K -> affine 4-bit,
    group 32"``, ``"Q6_K -> float32"``) and why each float32 one is float32 (keyed by ggml type, or by
    tensor name for a reason of that tensor's own)."""

    arrays: dict[str, np.ndarray]
    quantization: dict | None
    placed: dict[str, str]
    why_float32: dict[str, str]


def quantized_weights(c, cfg: dict, layout: str = "hf") -> QuantizedWeights:
    """The tensors of ``c`` (read with ``read_gguf(path, dequantize=False)``) as mlx-lm parameters:
    ``<module>.weight`` (uint32 codes), ``.scales`` and ``.biases`` (float32) for every Linear or
    Embedding weight whose ggml type :data:`PLACEMENTS` sends to MLX blocks, float32 for the rest.

    Every quantized tensor is checked as it is converted: ``mx.dequantize`` of its triplet must equal
    gguf-py's dequantization (:func:`same_values`); a tensor that does not (a non-finite d, say) stays
    float32 and ``placed`` says why. One tensor at a time is dequantized, so memory stays near the
    output's size.
    """
    from .model import dequantize_tensor, mlx_float, mlx_name, mlx_rows

    arrays: dict[str, np.ndarray] = {}
    per_layer: dict[str, dict | bool] = {}
    placed: dict[str, str] = {}
    why_float32: dict[str, str] = {}
    for name, t in c.raw.items():
        target, kind = mlx_name(c, name)
        ref = dequantize_tensor(t, c.path.name)          # float32, numpy order (rows, n)
        type_name = t.tensor_type.name
        p = placement(type_name)
        module = target[: -len(".weight")] if target.endswith(".weight") else None
        why, key = None, name
        if p.to != "affine":
            why, key = p.how, type_name
        elif module is None or kind not in QUANTIZABLE_KINDS or ref.ndim != 2:
            why = "not the weight matrix of a Linear or Embedding layer"
        elif ref.shape[1] % p.group_size:
            why = f"rows of {ref.shape[1]} values are not whole groups of {p.group_size}"
        if why is None:
            try:
                w, s, b, g, bits = to_mlx_quantized(type_name, np.asarray(t.data).reshape(ref.shape[0], -1),
                                                    ref.shape[1])
            except FormatError as e:
                why = f"no exact affine form: {e}"
            else:
                if not same_values(dequantize_mlx(w, s, b, g, bits), ref):
                    why = "mx.dequantize of its MLX blocks differs from gguf-py's values"
        if why is None:
            arrays[f"{module}.weight"] = mlx_rows(c, cfg, kind, w, layout)
            arrays[f"{module}.scales"] = mlx_rows(c, cfg, kind, s, layout)
            arrays[f"{module}.biases"] = mlx_rows(c, cfg, kind, b, layout)
            per_layer[module] = {"group_size": g, "bits": bits, "mode": "affine"}
            placed[name] = f"{type_name} -> affine {bits}-bit, group {g}"
        else:
            arrays[target] = mlx_float(c, name, kind, mlx_rows(c, cfg, kind, ref, layout))
            if module is not None and kind in QUANTIZABLE_KINDS:
                per_layer[module] = False
            placed[name] = f"{type_name} -> float32"
            why_float32[key] = why
        del ref
    quant = None
    if any(v for v in per_layer.values()):
        first = next(v for v in per_layer.values() if v)
        quant = {"group_size": first["group_size"], "bits": first["bits"], "mode": "affine", **per_layer}
    return QuantizedWeights(arrays, quant, placed, why_float32)
