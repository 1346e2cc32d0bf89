"""Logit-level agreement: per-position KL(P || Q), top-1 agreement, max |delta logit|.

Computed in float64 from the float32 logits, a few positions at a time (vocabularies reach 262k).
"""

from __future__ import annotations

import numpy as np


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    z = x - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def kl_per_position(p_logits: np.ndarray, q_logits: np.ndarray, chunk: int = 32) -> np.ndarray:
    """KL(softmax(p) || softmax(q)) for every row: shape (n,)."""
    p_logits, q_logits = np.asarray(p_logits), np.asarray(q_logits)
    if p_logits.shape != q_logits.shape or p_logits.ndim != 2:
        raise ValueError(f"logits must be two (positions, vocab) arrays of one shape, got "
                         f"{p_logits.shape} and {q_logits.shape}")
    out = np.empty(p_logits.shape[0], dtype=np.float64)
    for s in range(0, p_logits.shape[0], chunk):
        lp = _log_softmax(p_logits[s:s + chunk])
        lq = _log_softmax(q_logits[s:s + chunk])
        out[s:s + chunk] = np.maximum((np.exp(lp) * (lp - lq)).sum(axis=-1), 0.0)
    return out


def compare_logits(p_logits: np.ndarray, q_logits: np.ndarray) -> dict:
    """Summary of how far ``q`` is from the reference ``p`` (same tokens, same positions)."""
    kl = kl_per_position(p_logits, q_logits)
    top1 = np.argmax(p_logits, axis=-1) == np.argmax(q_logits, axis=-1)
    diff = np.abs(np.asarray(p_logits, np.float64) - np.asarray(q_logits, np.float64))
    return {
        "positions": int(kl.size),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "kl_p99": float(np.quantile(kl, 0.99)),
        "top1": float(top1.mean()),
        "max_abs": float(diff.max()),
        "kl_per_position": kl,
    }
