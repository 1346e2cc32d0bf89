"""MLX's fp16 SDPA of one decode step: no mask against the boolean mask mlx-lm's batch cache makes.

    python benchmarks/scripts/sdpa_mask.py

What ``tqbridge bench serve``'s fp16 baseline attends with: mlx-lm's ``BatchKVCache.make_mask(1)`` (left
padding as a boolean array), at 4K and 32K positions, batch 1 and 8, 32 query / 8 KV heads of 128 values.
Per case, the wall time of one evaluated call (launch and synchronisation included), the mean of 20 after
3 warm-ups.
"""
import time
import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache
H, HQ, D = 8, 32, 128
for L in (4096, 32768):
    for B in (1, 8):
        q = mx.random.normal((B, HQ, 1, D)).astype(mx.float16)
        k = mx.random.normal((B, H, L, D)).astype(mx.float16)
        c = BatchKVCache([0] * B)
        c.update_and_fetch(k[..., :-1, :], k[..., :-1, :])
        mask = c.make_mask(1)
        mx.eval(q, k, mask)
        for name, m in (("none", None), ("batch-cache mask", mask)):
            for _ in range(3):
                mx.eval(mx.fast.scaled_dot_product_attention(q, k, k, scale=D ** -0.5, mask=m))
            mx.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                o = mx.fast.scaled_dot_product_attention(q, k, k, scale=D ** -0.5, mask=m)
                mx.eval(o)
            print(f"L={L} B={B} mask={name} ({None if m is None else (m.shape, m.dtype)}): "
                  f"{(time.perf_counter() - t0) / 20 * 1e6:.1f} us per call", flush=True)
