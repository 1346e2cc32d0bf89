"""A build-like harness for ``tqbridge evidence``: a runtime over tqbridge's own codecs standing in for a
llama.cpp build, with planted decoding bugs the evidence must show.

:class:`FakeBuild` has the runtime interface :func:`tqbridge.parity.evidence.run_evidence` uses
(``tokenize``, ``logits``, ``time_prompt_decode``, ``flash_attn``, ``bits_per_value``, ``format_of``). Its
"model" is one causal attention layer in float64 (random embeddings, one head of :data:`HEAD_DIM` values,
a residual, a read-out to :data:`VOCAB` logits); every K and V row goes through the cache type's codec
(quantize, then dequantize) before attention, as a KV cache holds it. Its ``flash_attn`` dequantizes the
blocks with the same (possibly planted) decoder and attends in float64.

Planted types (:data:`PLANTED`), each claiming to be a correct turbo type:

- ``<turbo>-centroids-0.99``: blocks decoded with the codebook scaled by 0.99;
- ``<turbo>-group-halved``: the inverse rotation applied over groups of half the block (64 of 128 values).

The encoder is the correct one in both, so the bug lives in the build's decode path alone, where a port's
bug would.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tqbridge.bridge import dequantize, get_format, quantize
from tqbridge.bridge.blocks import rotation as turbo_rotation

VOCAB = 96
HEAD_DIM = 128
TURBO = "turbo3"
PLANTED = {f"{TURBO}-centroids-0.99": TURBO, f"{TURBO}-group-halved": TURBO}
# The read-out's scale: peaked next-token distributions (typical top probability ~0.3-0.8), as a trained
# model's are; a flat toy distribution would hide every cache error.
LOGIT_SCALE = 3.0


def planted_decode(name: str, blocks: np.ndarray) -> np.ndarray:
    """Float32 rows of ``blocks`` decoded as the (possibly planted) type ``name`` decodes them."""
    fmt = get_format(PLANTED.get(name, name))
    if name not in PLANTED:
        return dequantize(fmt, blocks, blocks.shape[-1] // fmt.type_size * fmt.block_size)
    from tqbridge.bridge.blocks.turbo import SPECS, TurboCodec

    spec = SPECS[fmt.key]
    b = np.ascontiguousarray(blocks, np.uint8).reshape(-1, spec.block_bytes)
    codec = TurboCodec(spec)
    if name.endswith("-centroids-0.99"):
        bad = dataclasses.replace(spec, centroids=(spec.centroids * np.float32(0.99)).astype(np.float32))
        rows = TurboCodec(bad).dequantize_blocks(b)
    else:
        y = codec.dequantize_blocks(b, rotated=True).astype(np.float32)
        half = spec.group // 2
        rows = turbo_rotation.inverse(y.reshape(-1, half), half).reshape(y.shape)
    return rows.reshape(*blocks.shape[:-1], -1).astype(np.float32)


class FakeBuild:
    """A deterministic stand-in for a llama.cpp build (see the module docstring)."""

    name = "fake-build"
    build = None

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        d = HEAD_DIM
        self.emb = rng.standard_normal((VOCAB, d))
        self.pos = 0.5 * rng.standard_normal((4096, d))
        self.wq, self.wk, self.wv = (rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(3))
        self.wk[:, rng.integers(0, d, 3)] *= 6.0      # outlier K channels, as real K caches have
        self.out = rng.standard_normal((d, VOCAB)) / np.sqrt(d)

    # the runtime interface
    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        body = [1 + (b % (VOCAB - 1)) for b in text.encode("utf-8")]
        return ([0] if add_bos else []) + body

    def twin_format(self, name: str) -> str:
        """The type tqbridge's own decoding of ``name`` is: the correct type a planted one claims to be."""
        return self.format_of(name)

    def format_of(self, name: str) -> str:
        return PLANTED.get(name, name)

    def bits_per_value(self, name: str) -> float:
        return get_format(self.format_of(name)).bits_per_value

    def _cache(self, name: str, rows: np.ndarray) -> np.ndarray:
        fmt = get_format(self.format_of(name))
        if fmt.kind == "float" and fmt.key == "f32":
            return rows
        return planted_decode(name, quantize(fmt, rows.astype(np.float32))).astype(np.float64)

    def logits(self, tokens, kv) -> np.ndarray:
        t = np.asarray(tokens, np.int64)
        x = self.emb[t] + self.pos[: len(t)]
        q, k, v = x @ self.wq, self._cache(kv.k, x @ self.wk), self._cache(kv.v, x @ self.wv)
        s = (q @ k.T) / np.sqrt(HEAD_DIM)
        s = np.where(np.tril(np.ones_like(s, bool)), s, -np.inf)
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
        h = x + w @ v
        return (LOGIT_SCALE * (h @ self.out)).astype(np.float32)

    def time_prompt_decode(self, tokens, kv, n_prompt: int) -> tuple[float, float]:
        import time

        t0 = time.perf_counter()
        self.logits(tokens[:n_prompt], kv)
        t1 = time.perf_counter()
        self.logits(tokens, kv)
        return t1 - t0, max(time.perf_counter() - t1, 1e-9)

    def flash_attn(self, q, kb, vb, kf, vf, *, scale: float, softcap: float, kv=None, visible=None) -> np.ndarray:
        """Attention over the blocks decoded as the case's types decode them, float64."""
        kname, vname = (kv.k, kv.v) if kv is not None else (kf.key, vf.key)
        d = q.shape[-1]
        kr = planted_decode(kname, kb)[..., :d].astype(np.float64)
        vr = planted_decode(vname, vb)[..., :d].astype(np.float64)
        rep = q.shape[0] // kr.shape[0]
        kr, vr = np.repeat(kr, rep, axis=0), np.repeat(vr, rep, axis=0)
        s = np.einsum("hd,hnd->hn", q.astype(np.float64), kr) * scale
        if softcap:
            s = softcap * np.tanh(s / softcap)
        if visible is not None:
            s = np.where(np.asarray(visible, bool)[None, :], s, -np.inf)
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
        return np.einsum("hn,hnd->hd", w, vr)
