"""Kernels with planted bugs, for the worked example of ``tqbridge fuzz`` (docs/plugin.md); run
``tqbridge fuzz fuzz_demo:<function>`` in this folder. Not part of the package.

Each looks plausible and passes a hand-written test or two; the fuzzer finds its bug in seconds:

- :func:`dequantize_turbo4_old_table`: decodes 66-byte ``turbo4@fork-pr197`` blocks with the
  centroid table of the older fork snapshot (``turbo4@fork-69d8e4b``): the layout matches, the
  values do not (a port that picked up the wrong table).
- :func:`attention_missing_gqa_index`: decode attention that maps query head ``h`` to KV head
  ``h % Hkv`` instead of ``h // (Hq / Hkv)``: right whenever Hkv is 1 or Hq == Hkv.
- :func:`dequantize_turbo4`: the correct twin of the first, built from the same parts.
"""

from __future__ import annotations

import numpy as np

from tqbridge.bridge import get_format
from tqbridge.bridge.blocks import rotation
from tqbridge.parity.testing import claims

_PR197 = "turbo4@fork-pr197"
_OLD = "turbo4@fork-69d8e4b"


def _decode_turbo4(blocks: np.ndarray, n: int, table: np.ndarray) -> np.ndarray:
    spec = get_format(_PR197).codec.spec
    b = np.ascontiguousarray(blocks, dtype=np.uint8)
    rows = b.shape[0]
    grouped = b.reshape(-1, spec.block_bytes)
    norm = grouped[:, 0:2].copy().view("<f2").reshape(-1).astype(np.float32)
    qs = grouped[:, spec.qs_offset:spec.qs_offset + spec.qs_bytes]
    idx = np.stack([qs & 15, qs >> 4], axis=-1).reshape(-1, spec.group)
    y = table[idx] * norm[:, None]
    return rotation.inverse(y, spec.group).reshape(rows, n)


@claims("dequantize", _PR197)
def dequantize_turbo4_old_table(blocks: np.ndarray, n: int) -> np.ndarray:
    """turbo4 (fork PR #197 blocks) decoded with the wrong, older centroid table. Planted bug."""
    return _decode_turbo4(blocks, n, get_format(_OLD).codec.spec.centroids)


@claims("dequantize", _PR197)
def dequantize_turbo4(blocks: np.ndarray, n: int) -> np.ndarray:
    """turbo4 (fork PR #197 blocks), decoded correctly."""
    return _decode_turbo4(blocks, n, get_format(_PR197).codec.spec.centroids)


@claims("decode-attention", k_format=["q8_0", "q4_0"], v_format=["q8_0", "q4_0"])
def attention_missing_gqa_index(q, k_blocks, v_blocks, *, k_format, v_format, length, scale=None, window=None,
                                softcap=None, sinks=None):
    """float32 decode attention for one query row per head, with a wrong GQA head mapping. Planted bug."""
    from tqbridge.bridge import dequantize
    from tqbridge.bridge.blocks.padding import padded_dim

    q = np.asarray(q, np.float32)
    rows4 = q.ndim == 4
    q4 = q if rows4 else q[:, :, None]
    b, hq, t, d = q4.shape
    hkv, lmax = k_blocks.shape[1], k_blocks.shape[2]
    k = dequantize(k_format, k_blocks, padded_dim(k_format, d))[..., :d]
    v = dequantize(v_format, v_blocks, padded_dim(v_format, d))[..., :d]
    lengths = [int(length)] * b if np.ndim(length) == 0 else [int(x) for x in length]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    out = np.zeros_like(q4)
    for bi in range(b):
        for h in range(hq):
            kv = h % hkv                      # BUG: should be h // (hq // hkv)
            for ti in range(t):
                hi = lengths[bi] - t + ti + 1
                lo = max(0, hi - window) if window else 0
                if hi <= lo:
                    continue
                s = (k[bi, kv, lo:hi] @ q4[bi, h, ti]) * np.float32(scale)
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                m = s.max() if sinks is None else max(s.max(), sinks[h])
                w = np.exp(s - m)
                den = w.sum() + (np.exp(sinks[h] - m) if sinks is not None else 0.0)
                out[bi, h, ti] = (w @ v[bi, kv, lo:hi]) / den
    return out if rows4 else out[:, :, 0]
