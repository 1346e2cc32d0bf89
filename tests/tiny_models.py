"""Tiny random mlx-lm models and helpers shared by the cache, calibration and quality tests."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import gemma3_text, llama

VOCAB = 97


def tiny_llama(head_dim: int = 64, seed: int = 1):
    """Llama family: 2 layers, 4 query / 2 KV heads."""
    args = llama.ModelArgs(model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
                           num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=VOCAB,
                           head_dim=head_dim, rope_theta=10000.0)
    mx.random.seed(seed)
    m = llama.Model(args)
    mx.eval(m.parameters())
    return m


def tiny_gemma3(window: int = 8, seed: int = 2):
    """Gemma 3 family: 4 layers, every other one a sliding-window layer of ``window`` positions."""
    args = gemma3_text.ModelArgs(model_type="gemma3_text", hidden_size=64, num_hidden_layers=4,
                                 intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                                 head_dim=64, vocab_size=VOCAB, sliding_window=window, sliding_window_pattern=2,
                                 query_pre_attn_scalar=64)
    mx.random.seed(seed)
    m = gemma3_text.Model(args)
    mx.eval(m.parameters())
    return m


def tokens(n: int, seed: int = 0) -> mx.array:
    return mx.array(np.random.default_rng(seed).integers(0, VOCAB, (1, n)))


@pytest.fixture(autouse=True)
def cpu_device():
    """Float-path comparisons at float32-CPU tolerances run on MLX's CPU device on every machine. On
    the H200 (MLX's CUDA backend) 9 of them missed those tolerances (the Hadamard round trip by more
    than 1e-5, path agreement by more than 3e-3): float32 matmuls there are not CPU-exact. The fused
    kernel on a GPU is covered by the gpu-marked tests of test_attention_kernel.py and by the
    recorded real-model runs (BENCHMARKS.md). Import it into a test module to use it there."""
    prev = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(prev)


def forced_decode(m, toks: mx.array, cache: list, mode: str = "auto", prompt: int = 5) -> np.ndarray:
    """Teacher-forced decode under ``route_attention(mode)``: the first ``prompt`` tokens as one chunk,
    then one token per step (the same tokens whatever the cache does: no cascade); per-step logits
    (float32), every cache checked for non-finite rows after."""
    from tqbridge.metal.lm.routing import route_attention

    out = []
    with route_attention(mode):
        mx.eval(m(toks[:, :prompt], cache=cache))
        for i in range(prompt, toks.shape[1]):
            lg = m(toks[:, i:i + 1], cache=cache)[0, -1].astype(mx.float32)
            mx.eval(lg)
            out.append(np.array(lg))
    for c in cache:
        c.check_finite()
    return np.stack(out)
