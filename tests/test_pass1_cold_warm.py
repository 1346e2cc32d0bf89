"""benchmarks/scripts/pass1_cold_warm.py's arithmetic on made-up kernel stamps: which pass 1 is the first of a
layer (the folded build, or the first of two plain ones) and which the repeat, the combines in pairs."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "scripts"))

import pass1_cold_warm as cw  # noqa: E402

FOLD = "mlx::core::cu::custom_kernel_tq_attention_split_int8_mma_fold_2cd0"
PLAIN = "mlx::core::cu::custom_kernel_tq_attention_split_int8_mma_31a9"
COMB = "mlx::core::cu::custom_kernel_tq_attention_combine_3842"
GEMV = "void mlx::core::cu::gemv_single<__half, 8, 4>"


def _layers(first: str, durations: list) -> list:
    """Stamps of layers, each: a gemv, pass 1 (``first``), combine, plain pass 1, combine; durations per layer
    (first pass 1, first combine, repeat, second combine)."""
    ev, t = [], 0.0
    for d1, c1, d2, c2 in durations:
        for name, d in ((GEMV, 50.0), (first, d1), (COMB, c1), (PLAIN, d2), (COMB, c2)):
            ev.append((name, t, t + d))
            t += d + 1.0
    return ev


def test_folded_first_and_plain_repeat():
    got = cw.cold_warm(_layers(FOLD, [(20.0, 9.0, 13.0, 4.0), (19.0, 8.0, 12.0, 4.5), (21.0, 9.5, 14.0, 3.5)]), False)
    assert got == {"pass1_folded_us": 20.0, "pass1_plain_after_us": 13.0, "combine_first_us": 9.0,
                   "combine_second_us": 4.0, "pass1_launches": 6}


def test_plain_pairs_split_by_order():
    got = cw.cold_warm(_layers(PLAIN, [(18.0, 9.0, 13.0, 4.0), (17.0, 8.0, 12.0, 4.5), (19.0, 9.5, 14.0, 3.5)]), True)
    assert got["pass1_first_us"] == 18.0 and got["pass1_plain_after_us"] == 13.0 and "pass1_folded_us" not in got


def test_no_folded_build_is_no_answer():
    # the fold off (or refused) while the run asked for it: every pass 1 plain, so nothing to pair
    assert cw.cold_warm(_layers(PLAIN, [(18.0, 9.0, 13.0, 4.0)] * 2), False) is None
    assert cw.cold_warm([], True) is None
