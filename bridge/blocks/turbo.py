"""TurboQuant block formats turbo2 / turbo3 / turbo4 of the llama.cpp TurboQuant fork, byte-exact.

One block is one rotation group (128 values): an fp16 corrected norm plus the packed Lloyd–Max
indices of the rotated, normalised group (see ``docs/turbo.md`` and :mod:`.rotation`). Variants:

- ``fork-pr197`` (default): corrected centroids, 66-byte turbo4. TheTom/llama-cpp-turboquant PR #197,
  as shipped in thecodacus/llama.cpp @ 40f20368df5ae43e7f969098e1e34c8c2cbcf636.
- ``fork-69d8e4b``: TheTom/llama-cpp-turboquant @ 69d8e4be47243e83b3d0d71e932bc7aa61c644dc, narrow
  ("old") 3- and 4-bit centroids and a 68-byte turbo4 with an unused ``rnorm`` field written as 0.
- ``g64``: a tqbridge extension the fork cannot read: the same algorithm on 64-value groups
  (1/8 normalisation, first 64 sign-table entries, Lloyd–Max centroids for N(0, 1/64)).

Everything a kernel needs is on ``get_format(name).codec.spec`` (:class:`TurboSpec`); :data:`FORMATS`
are this module's registry entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import rotation
from .format_types import Format, FormatError

# ----- centroid tables (positive halves, ascending; the tables are symmetric) -----
# fork tables: float32 literals of ggml/src/ggml-turbo-quant.c at the commits named above.
_HALF = {
    (2, "fork"): ([0.039994, 0.133462], [0.086728]),
    (3, "old"): ([0.021460, 0.065717, 0.117832, 0.190685], [0.043589, 0.091775, 0.154259]),
    (3, "corrected"): ([0.021663, 0.066822, 0.118786, 0.190207], [0.044243, 0.092804, 0.154496]),
    (4, "old"): ([0.006938, 0.020989, 0.035597, 0.051262, 0.068756, 0.089527, 0.117195, 0.173926],
                 [0.013963, 0.028293, 0.043430, 0.060009, 0.079142, 0.103361, 0.145560]),
    (4, "corrected"): ([0.011349, 0.034299, 0.058050, 0.083292, 0.111036, 0.143016, 0.182877, 0.241529],
                       [0.022824, 0.046174, 0.070671, 0.097164, 0.127026, 0.162947, 0.212203]),
    # g64 (tqbridge): Lloyd–Max for N(0, 1/64), i.e. the standard-normal Lloyd–Max levels / 8, computed
    # by :func:`tqbridge.bridge.blocks.lloyd_max.lloyd_max_normal` (float64, iterated to a fixed point) and
    # rounded to float32; midpoints are float32((c[i] + c[i+1]) / 2) of those float32 centroids.
    (2, "g64"): ([0.056597505, 0.1888022], [0.12269985]),
    (3, "g64"): ([0.030636773, 0.09450066, 0.16798866, 0.2689932], [0.06256872, 0.13124466, 0.21849093]),
    (4, "g64"): ([0.01604938, 0.048506036, 0.08209489, 0.117792554, 0.1570289, 0.2022558, 0.25862715, 0.3415737],
                 [0.032277707, 0.065300465, 0.09994373, 0.13741073, 0.17964235, 0.23044148, 0.30010042]),
}

ZERO_THRESHOLD = np.float32(1e-10)  # C: (norm > 1e-10f) ? ... ; same for the reconstruction norm


def _symmetric(half: list[float], zero: bool) -> np.ndarray:
    h = np.array(half, dtype=np.float32)
    parts = [-h[::-1], [np.float32(0)], h] if zero else [-h[::-1], h]
    a = np.concatenate(parts).astype(np.float32)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class TurboSpec:
    """The constants of one turbo format, as kernels need them (arrays are read-only float32)."""

    name: str                 # the base name, e.g. turbo3
    variant: str              # "fork-pr197" | "fork-69d8e4b" | "g64"
    bits: int                 # 2, 3, 4
    group: int                # values per block = rotation group (128, or 64 for g64)
    block_bytes: int
    norm_offset: int          # fp16 corrected norm
    rnorm_offset: int | None  # fp16 written as 0 (turbo4 of fork-69d8e4b only)
    qs_offset: int            # turbo2/3: 2-bit fields, 4 per byte, LSB first; turbo4: nibbles, even j low
    qs_bytes: int
    signs_offset: int | None  # turbo3: bit 2 of each index, 8 per byte, LSB first
    signs_bytes: int
    centroids: np.ndarray     # (2**bits,) ascending; index 0 most negative
    midpoints: np.ndarray     # (2**bits - 1,) ascending; a value equal to a midpoint takes the upper index
    s1: np.ndarray            # (group,) ±1, applied before the butterfly
    s2: np.ndarray            # (group,) ±1, applied with the scale after the butterfly
    scale: np.float32         # 1/sqrt(group) as the C float32 literal
    zero_threshold: np.float32 = ZERO_THRESHOLD

    @property
    def levels(self) -> int:
        return 1 << self.bits


def _make_spec(name: str, variant: str, bits: int, table: str, group: int = 128, rnorm: bool = False) -> TurboSpec:
    half_c, half_m = _HALF[(bits, table)]
    s1, s2 = rotation.sign_tables(group)
    if bits == 4:
        qs_off = 4 if rnorm else 2
        qs_bytes, signs_off, signs_bytes = group // 2, None, 0
    else:
        qs_off, qs_bytes = 2, group // 4
        signs_off, signs_bytes = (2 + qs_bytes, group // 8) if bits == 3 else (None, 0)
    block_bytes = qs_off + qs_bytes + signs_bytes
    return TurboSpec(
        name=name, variant=variant, bits=bits, group=group, block_bytes=block_bytes,
        norm_offset=0, rnorm_offset=2 if rnorm else None, qs_offset=qs_off, qs_bytes=qs_bytes,
        signs_offset=signs_off, signs_bytes=signs_bytes,
        centroids=_symmetric(half_c, zero=False), midpoints=_symmetric(half_m, zero=True),
        s1=s1, s2=s2, scale=rotation.SCALES[group],
    )


# ----- numpy helpers -----

def _seq_sum(t: np.ndarray) -> np.ndarray:
    """Sequential float32 sum over the last axis, j = 0, 1, ... (the C loop's order, not pairwise)."""
    acc = np.zeros(t.shape[:-1], dtype=np.float32)
    for j in range(t.shape[-1]):
        acc = acc + t[..., j]
    return acc


def _fp16_bytes(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return v.astype("<f2").view(np.uint8).reshape(*v.shape, 2)


class TurboCodec:
    """Block codec for one turbo format; numpy reference and MLX twin, byte-identical."""

    def __init__(self, spec: TurboSpec):
        self.spec = spec

    def __repr__(self) -> str:
        return f"TurboCodec({self.spec.name}@{self.spec.variant})"

    # --- the algorithm, split so kernels and tests can reach each step ---

    def rotated_indices(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Group norms ``g`` (n,) and indices (n, group) uint8 of float32 groups ``x`` (n, group)."""
        sp = self.spec
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != sp.group:
            raise FormatError(f"{sp.name}@{sp.variant}: expected blocks of shape (n, {sp.group}), got {x.shape}")
        if not np.isfinite(x).all():
            bad = np.argwhere(~np.isfinite(x))[0]
            raise FormatError(
                f"{sp.name}@{sp.variant}: non-finite input value {x[tuple(bad)]} in block {bad[0]} "
                "(the fork's quantizer has no defined result for NaN/inf)")
        with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
            g = np.sqrt(_seq_sum(x * x))
            inv = np.where(g > sp.zero_threshold, np.float32(1) / g, np.float32(0)).astype(np.float32)
            u = rotation.forward(x * inv[:, None], sp.group)
        return g, self.nearest(u)

    def nearest(self, u: np.ndarray) -> np.ndarray:
        """Index of the nearest centroid of rotated, normalised values ``u``: the number of midpoints
        ``<= u`` (C: strict ``u < midpoint`` tested from the lowest, so a tie takes the upper index)."""
        return np.searchsorted(self.spec.midpoints, u, side="right").astype(np.uint8)

    def corrected_norm(self, g: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """The stored norm (float32, before fp16 rounding): ``g / ||c[idx]||`` (or ``g`` if that is ~0)."""
        sp = self.spec
        c = sp.centroids[idx]
        r = np.sqrt(_seq_sum(c * c))
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            return np.where(r > sp.zero_threshold, g / r, g).astype(np.float32)

    def pack(self, norm: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """Blocks (n, block_bytes) from float32 norms (n,) and indices (n, group)."""
        sp = self.spec
        n = idx.shape[0]
        out = np.zeros((n, sp.block_bytes), dtype=np.uint8)
        out[:, 0:2] = _fp16_bytes(norm.astype(np.float32))
        if sp.bits == 4:
            nib = idx.reshape(n, sp.qs_bytes, 2)
            out[:, sp.qs_offset:sp.qs_offset + sp.qs_bytes] = nib[:, :, 0] | (nib[:, :, 1] << 4)
        else:
            low = (idx & 3).reshape(n, sp.qs_bytes, 4)
            out[:, sp.qs_offset:sp.qs_offset + sp.qs_bytes] = (
                low[:, :, 0] | (low[:, :, 1] << 2) | (low[:, :, 2] << 4) | (low[:, :, 3] << 6))
            if sp.bits == 3:
                hi = ((idx >> 2) & 1).reshape(n, sp.signs_bytes, 8)
                acc = np.zeros((n, sp.signs_bytes), dtype=np.uint8)
                for k in range(8):
                    acc |= hi[:, :, k] << k
                out[:, sp.signs_offset:sp.signs_offset + sp.signs_bytes] = acc
        return out

    def unpack(self, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(norm float32 (n,), indices uint8 (n, group))`` of blocks (n, block_bytes)."""
        sp = self.spec
        b = np.ascontiguousarray(b, dtype=np.uint8)
        if b.ndim != 2 or b.shape[1] != sp.block_bytes:
            raise FormatError(f"{sp.name}@{sp.variant}: expected blocks of shape (n, {sp.block_bytes}), got {b.shape}")
        n = b.shape[0]
        norm = b[:, 0:2].copy().view("<f2").reshape(n).astype(np.float32)
        qs = b[:, sp.qs_offset:sp.qs_offset + sp.qs_bytes]
        if sp.bits == 4:
            idx = (qs[:, :, None] >> np.array([0, 4], np.uint8)) & 15
        else:
            idx = (qs[:, :, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
            if sp.bits == 3:
                sg = b[:, sp.signs_offset:sp.signs_offset + sp.signs_bytes]
                hi = (sg[:, :, None] >> np.arange(8, dtype=np.uint8)) & 1
                idx = idx.reshape(n, sp.group) | (hi.reshape(n, sp.group) << 2)
        return norm, idx.reshape(n, sp.group).astype(np.uint8)

    # --- the codec contract ---

    def quantize_blocks(self, x: np.ndarray) -> np.ndarray:
        g, idx = self.rotated_indices(x)
        return self.pack(self.corrected_norm(g, idx), idx)

    def dequantize_blocks(self, b: np.ndarray, rotated: bool = False) -> np.ndarray:
        """Values in the original basis; ``rotated=True``: the stored rotated-basis values (the fork's
        ``dequantize_row_turbo*``)."""
        norm, idx = self.unpack(b)
        with np.errstate(over="ignore", invalid="ignore"):
            y = self.spec.centroids[idx] * norm[:, None]
            return y if rotated else rotation.inverse(y, self.spec.group)

    # --- MLX twin (same operations in the same order) ---

    def mlx_quantize_blocks(self, x: Any, check_finite: bool = True) -> Any:
        """``check_finite=False`` skips the NaN/inf refusal (a host sync); the caller checks instead."""
        import mlx.core as mx

        sp = self.spec
        if x.ndim != 2 or x.shape[1] != sp.group:
            raise FormatError(f"{sp.name}@{sp.variant}: expected blocks of shape (n, {sp.group}), got {tuple(x.shape)}")
        x = x.astype(mx.float32)
        if check_finite and not bool(mx.all(mx.isfinite(x)).item()):
            raise FormatError(f"{sp.name}@{sp.variant}: non-finite input value (the fork's quantizer has no "
                              "defined result for NaN/inf)")
        from .mlx_ggml import seq_sum

        sq = x * x
        g = mx.sqrt(seq_sum(sq))
        thr = mx.array(sp.zero_threshold)
        inv = mx.where(g > thr, mx.array(1.0, mx.float32) / g, mx.array(0.0, mx.float32))
        u = rotation.mlx_forward(x * inv[:, None], sp.group)
        idx = self.mlx_nearest(u)
        c = mx.array(sp.centroids)[idx.astype(mx.int32)]
        r = mx.sqrt(seq_sum(c * c))
        norm = mx.where(r > thr, g / r, g)
        return self._mlx_pack(mx, norm, idx)

    def mlx_nearest(self, u: Any) -> Any:
        """MLX twin of :meth:`nearest`."""
        import mlx.core as mx

        return (u[..., None] >= mx.array(self.spec.midpoints)).astype(mx.uint8).sum(axis=-1).astype(mx.uint8)

    def _mlx_pack(self, mx: Any, norm: Any, idx: Any) -> Any:
        sp = self.spec
        n = idx.shape[0]
        parts = [mx.view(norm.astype(mx.float16), mx.uint8).reshape(n, 2)]
        if sp.rnorm_offset is not None:
            parts.append(mx.zeros((n, 2), dtype=mx.uint8))
        if sp.bits == 4:
            nib = idx.reshape(n, sp.qs_bytes, 2)
            parts.append(nib[:, :, 0] | (nib[:, :, 1] << 4))
        else:
            low = (idx & 3).reshape(n, sp.qs_bytes, 4)
            parts.append(low[:, :, 0] | (low[:, :, 1] << 2) | (low[:, :, 2] << 4) | (low[:, :, 3] << 6))
            if sp.bits == 3:
                hi = ((idx >> 2) & 1).reshape(n, sp.signs_bytes, 8)
                acc = hi[:, :, 0]
                for k in range(1, 8):
                    acc = acc | (hi[:, :, k] << k)
                parts.append(acc)
        return mx.concatenate([p.astype(mx.uint8) for p in parts], axis=1)

    def mlx_unpack(self, b: Any) -> tuple[Any, Any]:
        """MLX twin of :meth:`unpack`."""
        import mlx.core as mx

        sp = self.spec
        if b.ndim != 2 or b.shape[1] != sp.block_bytes:
            raise FormatError(f"{sp.name}@{sp.variant}: expected blocks of shape (n, {sp.block_bytes}), got {tuple(b.shape)}")
        n = b.shape[0]
        norm = mx.view(mx.contiguous(b[:, 0:2]), mx.float16).reshape(n).astype(mx.float32)
        qs = b[:, sp.qs_offset:sp.qs_offset + sp.qs_bytes]
        if sp.bits == 4:
            idx = (qs[:, :, None] >> mx.array([0, 4], dtype=mx.uint8)) & 15
        else:
            idx = (qs[:, :, None] >> mx.array([0, 2, 4, 6], dtype=mx.uint8)) & 3
            if sp.bits == 3:
                sg = b[:, sp.signs_offset:sp.signs_offset + sp.signs_bytes]
                hi = (sg[:, :, None] >> mx.arange(8, dtype=mx.uint8)) & 1
                idx = idx.reshape(n, sp.group) | (hi.reshape(n, sp.group) << 2)
        return norm, idx.reshape(n, sp.group).astype(mx.uint8)

    def mlx_dequantize_blocks(self, b: Any, rotated: bool = False) -> Any:
        import mlx.core as mx

        norm, idx = self.mlx_unpack(b)
        y = mx.array(self.spec.centroids)[idx.astype(mx.int32)] * norm[:, None]
        return y if rotated else rotation.mlx_inverse(y, self.spec.group)


# ----- registry entries -----

# Where each ggml type id applies (the forks number the types differently).
_WHERE_69D8E4B = "TheTom/llama-cpp-turboquant@69d8e4b"
_WHERE_PR197 = "thecodacus/llama.cpp@40f2036"
_IDS = {
    "fork-69d8e4b": {"turbo2": 42, "turbo3": 43, "turbo4": 44},
    "fork-pr197": {"turbo2": 43, "turbo3": 44, "turbo4": 45},
}

DEFAULT_VARIANT = "fork-pr197"   # the variant a bare name (turbo3) means

SPECS: dict[str, TurboSpec] = {}
FORMATS: list[Format] = []       # this module's registry entries, in registry order


def _build_entries() -> None:
    # the kernels' format ids (TQA_TURBO2..4 in metal/kernels/attention_kernel.h); one for all variants
    for name, bits, kernel_id in (("turbo2", 2, 9), ("turbo3", 3, 10), ("turbo4", 4, 11)):
        specs = [
            (_make_spec(name, "fork-pr197", bits, "fork" if bits == 2 else "corrected"),
             {_WHERE_PR197: _IDS["fork-pr197"][name]}, False,
             "fork PR #197: corrected Lloyd-Max centroids" + (", 66-byte block" if bits == 4 else "")),
            (_make_spec(name, "fork-69d8e4b", bits, "fork" if bits == 2 else "old", rnorm=bits == 4),
             {_WHERE_69D8E4B: _IDS["fork-69d8e4b"][name]}, False,
             "fork snapshot 2026-05-04: narrow centroids" + (", 68-byte block (unused rnorm)" if bits == 4 else "")
             if bits > 2 else "fork snapshot 2026-05-04 (same bytes as fork-pr197)"),
            (_make_spec(name, "g64", bits, "g64", group=64), {}, True,
             "tqbridge extension: native 64-value groups, Lloyd-Max for N(0, 1/64); the fork cannot read it"),
        ]
        for spec, ids, ext, desc in specs:
            SPECS[f"{name}@{spec.variant}"] = spec
            FORMATS.append(Format(
                name=name, variant=spec.variant, kind="turbo", block_size=spec.group, type_size=spec.block_bytes,
                codec=TurboCodec(spec), type_ids=ids, description=desc, extension=ext, kernel_id=kernel_id,
            ))


_build_entries()
