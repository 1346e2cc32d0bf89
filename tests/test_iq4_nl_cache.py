"""iq4_nl's second quantizer: what llama.cpp's CPU backend writes into an iq4_nl KV cache.

``quantize_row_iq4_nl_ref`` (ntry = -1: no scale search) differs from ``ggml_quantize_chunk``'s
quantizer in 32-54% of the blocks of a real cache (docs/levels.md), so the cache-level parity needs
both. Blocks whose |x| is all below ggml's GROUP_MAX_EPS are left out of the comparison: C leaves
their indices unwritten (stale stack memory), so their bytes are undefined there.
"""

import ctypes

import numpy as np
import pytest
from hypothesis import given

from tqbridge.bridge import quantize
from tqbridge.parity.plugin.strategies import adversarial_rows, float_rows

ggml_c = pytest.importorskip("tqbridge.bridge.llama.ggml_c")


def _c_ref(row: np.ndarray) -> np.ndarray:
    if not ggml_c.available():
        pytest.skip("ggml's C library is not available (llama-cpp-python is not installed)")
    lib = ggml_c.load()
    f = lib.quantize_row_iq4_nl_ref
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    f.restype = None
    row = np.ascontiguousarray(row, dtype=np.float32)
    out = np.zeros(row.size // 32 * 18, np.uint8)
    f(row.ctypes.data, out.ctypes.data, row.size)
    return out


def _live_blocks_equal(row: np.ndarray) -> None:
    live = np.abs(row.reshape(-1, 32)).max(axis=1) >= np.float32(1e-15)
    ours = quantize("iq4_nl", row, search=False).reshape(-1, 18)[live]
    ref = _c_ref(row).reshape(-1, 18)[live]
    assert np.array_equal(ours, ref), f"{int((ours != ref).any(1).sum())} of {len(ref)} blocks differ"


def test_adversarial_rows_match_quantize_row_ref():
    rows = adversarial_rows()
    for row in rows[np.isfinite(rows).all(axis=1)]:
        _live_blocks_equal(row)


@given(float_rows(block_size=32, max_blocks=8))
def test_drawn_rows_match_quantize_row_ref(row):
    _live_blocks_equal(np.asarray(row, dtype=np.float32))


def test_the_two_quantizers_really_differ():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 128)).astype(np.float32)
    a, b = quantize("iq4_nl", x), quantize("iq4_nl", x, search=False)
    assert not np.array_equal(a, b)
