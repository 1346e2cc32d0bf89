"""Per-row starts (``decode_attention(..., start=...)``): a batch row's keys below its start (mlx-lm's left
padding) are invisible. Every pass-1 kernel on the emulator (and a GPU, gpu marker) against the float64
oracle per row, and each row against the same problem alone with its visible keys moved to the front.
"""

from __future__ import annotations

import numpy as np
import pytest

from tqbridge import bridge
from tqbridge.metal.attention import AttentionError, check_problem, decode_attention, last_run
from tqbridge.metal.attention.problem import visible_range
from tqbridge.metal.attention.ref import oracle
from helpers_kernels import quantized_cache
from test_attention_kernel import BACKENDS, seed_of

L = 70            # stored length of every row (mlx-lm's batch: one buffer index for all rows)
SPLITS = 4        # forced, so a start can fall inside a split and whole splits lie below it
D = 128
# (K, V, kernel, q_precision): kernels lanes and tiles with exact q, int8-mma with int8 q
CASES = [
    ("q8_0", "turbo3", "lanes", "exact"),
    ("q8_0", "turbo3", "tiles", "exact"),
    ("f16", "f16", "tiles", "exact"),
    ("f16", "f16", "lanes", "exact"),
    ("q8_0", "q4_0", "int8-mma", "int8"),
    ("q8_0", "turbo3", "int8-mma", "int8"),
]
# (T, window, sinks)
OPTIONS = [(1, None, False), (1, 20, True), (3, None, True), (3, 9, False)]


def _starts(b: int, split_len: int) -> list[int]:
    """``b`` starts from the interesting ones: 0, 1, inside the second split, the last key, none visible."""
    pool = [split_len + split_len // 2, 0, L - 1, 1, L]
    return pool[:b] if b < 4 else [pool[0], pool[2], pool[3], pool[4]]


def _problem(kf, vf, b, t, sinks, seed):
    rng = np.random.default_rng(seed)
    hkv, g = 2, 2
    q = rng.standard_normal((b, hkv * g, t, D) if t > 1 else (b, hkv * g, D)).astype(np.float32)
    kb = quantized_cache(rng, kf, (b, hkv, L, D))
    vb = quantized_cache(rng, vf, (b, hkv, L, D))
    sk = (rng.standard_normal(hkv * g) * 2).astype(np.float32) if sinks else None
    return q, kb, vb, sk


def _run(backend, q, kb, vb, kf, vf, kernel, qp, **kw):
    out = decode_attention(q, kb, vb, k_format=kf, v_format=vf, backend=backend, kernel=kernel, q_precision=qp,
                           splits=SPLITS, **kw)
    run = last_run()
    assert run["kernel"] == kernel, run
    return np.asarray(out, np.float64), run


def _oracle(q, kb, vb, kf, vf, run, **kw):
    prob = check_problem(q, kb, vb, k_format=kf, v_format=vf, **kw)
    want, bound = oracle(q, kb, vb, prob, kw.get("sinks"), chain=run["chain"], q_precision=run["q_precision"])
    if prob.squeeze_rows:
        want, bound = want[:, :, 0], bound[:, :, 0]
    return want, bound


def _within(got, want, bound, what):
    err = np.abs(got - want)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), f"{what}: error {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t,window,sinks", OPTIONS)
@pytest.mark.parametrize("kf,vf,kernel,qp", CASES)
@pytest.mark.parametrize("b", [1, 2, 3, 4])
def test_rows_see_keys_from_their_start(backend, b, kf, vf, kernel, qp, t, window, sinks):
    """Per row against the float64 oracle (its bound, the kernel's chain), and against the same row
    alone with its keys [start, L) moved to the front and start 0 (the sliced call)."""
    if kernel == "int8-mma" and t * 2 > 8:
        t = 2   # int8-mma serves at most 8 query rows per KV head (G = 2 here)
    q, kb, vb, sk = _problem(kf, vf, b, t, sinks, seed_of(f"start-{kf}-{vf}-{kernel}-{b}-{t}-{window}-{sinks}"))
    # the splits the plan makes of SPLITS asked (a GPU plan may round the split length to its tiles: fewer)
    _, plan = _run(backend, q, kb, vb, kf, vf, kernel, qp, length=L, window=window, sinks=sk)
    assert plan["splits"] >= 2, plan   # a start inside the second split needs one
    starts = _starts(b, -(-L // plan["splits"]))
    kw = dict(length=L, window=window, sinks=sk, start=starts)
    got, run = _run(backend, q, kb, vb, kf, vf, kernel, qp, **kw)
    assert run["splits"] == plan["splits"], run   # (a short sliced call below gets fewer)
    want, bound = _oracle(q, kb, vb, kf, vf, run, **kw)
    _within(got, want, bound, f"starts {starts}")
    for i, s in enumerate(starts):
        lo, hi = visible_range(L, t, t - 1, window or 0, s)   # the last query row's keys: the most any row sees
        if lo == hi:
            assert not got[i].any(), f"row {i} (start {s}) sees no key: zeros"
        # the same row alone: its keys [s, L) at the front of a buffer of the same capacity, start 0
        ks, vs = np.zeros_like(kb[i:i + 1]), np.zeros_like(vb[i:i + 1])
        ks[:, :, :L - s], vs[:, :, :L - s] = kb[i:i + 1, :, s:], vb[i:i + 1, :, s:]
        one, run1 = _run(backend, q[i:i + 1], ks, vs, kf, vf, kernel, qp, length=L - s, window=window, sinks=sk)
        want1, bound1 = _oracle(q[i:i + 1], ks, vs, kf, vf, run1, length=L - s, window=window, sinks=sk)
        # the float64 answers are the same keys' attention: equal up to the float64 sum order
        np.testing.assert_allclose(want1[0], want[i], rtol=F64_REORDER, atol=F64_REORDER)
        # the two kernel runs group the keys into other splits and tiles (a key's score and weight are
        # rounded against another running max, the sums add in another order): each is within its bound
        # of that one answer, so they differ by at most the sum of the bounds (the triangle inequality)
        _within(one[0], got[i], bound[i] + bound1[0], f"row {i} (start {s}) vs its sliced call")
        if qp == "exact":   # and much closer: the same float32 scores and values, summed in another grouping
            tol = SLICED_EXACT_ULPS * 2.0 ** -24 * max(np.abs(got[i]).max(), np.abs(one[0]).max())
            assert np.abs(one[0] - got[i]).max() <= tol, f"row {i} (start {s}) vs its sliced call"


# exact-q kernels (lanes, tiles): a row and its sliced call differ by at most this many float32 unit
# roundoffs of the row's largest output value (origin: measured on the emulator, at most 3 over these
# cases; the margin covers other split / tile groupings of the same sums; int8-mma rounds its weights
# to binary16 against another running max, so it is held to the bounds alone)
SLICED_EXACT_ULPS = 64
# float64 attention of the same keys summed in another order: a few ulp of float64 per term, far below
# any float32 bound (origin: float64's unit roundoff 2^-53 times the at most L = 70 terms, rounded up)
F64_REORDER = 1e-12


def test_start_on_the_reference_path_matches_the_oracle():
    """The MLX-ops reference masks keys below each row's start too (within its float32 bound)."""
    pytest.importorskip("mlx.core", reason="the reference path runs MLX ops")
    q, kb, vb, sk = _problem("q8_0", "turbo3", 3, 2, True, seed_of("start-reference"))
    kw = dict(length=L, window=30, sinks=sk, start=[0, 33, L - 1])
    got = np.asarray(decode_attention(q, kb, vb, k_format="q8_0", v_format="turbo3", backend="reference", **kw),
                     np.float64)
    prob = check_problem(q, kb, vb, k_format="q8_0", v_format="turbo3", **kw)
    want, bound = oracle(q, kb, vb, prob, sk)   # chain: the cache length (the reference's order is MLX's)
    _within(got, want, bound, "reference")


def test_start_changes_the_answer():
    """A start hides keys: the answer moves (so a start the kernel ignored would fail the tests above)."""
    q, kb, vb, _ = _problem("q8_0", "q8_0", 2, 1, False, seed_of("start-moves"))
    base = decode_attention(q, kb, vb, k_format="q8_0", v_format="q8_0", length=L, backend="cpu-emulator")
    moved = decode_attention(q, kb, vb, k_format="q8_0", v_format="q8_0", length=L, start=[0, 5],
                             backend="cpu-emulator")
    assert np.array_equal(base[0], moved[0]) and not np.allclose(base[1], moved[1])


@pytest.mark.parametrize("start,match", [
    (-1, r"start -1 of batch row 0 is outside 0\.\.70"),
    ([0, 71], r"start 71 of batch row 1 is outside 0\.\.70"),
    ([0, 1, 2], "start has 3 entries for a batch of 2"),
    ("x", "start must be an int or one int per batch row"),
])
def test_bad_starts_get_one_line_errors(start, match):
    q, kb, vb, _ = _problem("q8_0", "q8_0", 2, 1, False, 1)
    with pytest.raises(AttentionError, match=match) as e:
        decode_attention(q, kb, vb, k_format="q8_0", v_format="q8_0", length=L, start=start, backend="cpu-emulator")
    assert "\n" not in str(e.value)
    with pytest.raises(AttentionError, match="start 9 of batch row 0 is outside 0..8"):
        check_problem(q, kb, vb, k_format="q8_0", v_format="q8_0", length=[8, L], start=9)


ROW_START_CLIP = "if (start < row_lo) start = row_lo;"   # the one line of each pass-1 kernel that applies the start


@pytest.mark.parametrize("kf,vf,kernel,qp", [CASES[0], CASES[1], CASES[4]], ids=["lanes", "tiles", "int8-mma"])
def test_a_start_off_by_one_in_a_kernel_is_caught(monkeypatch, kf, vf, kernel, qp):
    """Planted: one pass-1 kernel hides its row's first visible key too (``row_lo + 1``); the oracle check
    above fails on it, and passes again once the source is back."""
    import functools
    import pathlib

    from tqbridge.metal import attention, kernel as kmod
    from tqbridge.metal.attention import build as attention_build
    from tqbridge.metal.attention import kernel as attention_kernel
    from tqbridge.metal.attention import launch as attention_launch
    from tqbridge.metal.attention import plan as attention_plan
    from tqbridge.metal.attention.build import SPLIT_SOURCES

    def clear():
        for mod in (attention_kernel, attention_build, attention_launch, attention_plan, kmod):
            for obj in vars(mod).values():
                if isinstance(obj, functools._lru_cache_wrapper):
                    obj.cache_clear()
        attention.clear_call_caches()

    real_read = pathlib.Path.read_text

    def edited(self, *a, **kw):
        text = real_read(self, *a, **kw)
        if self.name == SPLIT_SOURCES[kernel]:
            assert ROW_START_CLIP in text, f"the planted bug's anchor is gone from {self.name}: update this test"
            text = text.replace(ROW_START_CLIP, "if (start < row_lo + 1) start = row_lo + 1;")
        return text

    args = ("cpu-emulator", 3, kf, vf, kernel, qp, 1, None, False)
    with monkeypatch.context() as m:
        m.setattr(pathlib.Path, "read_text", edited)
        clear()
        try:
            with pytest.raises(AssertionError, match="error .* > bound"):
                test_rows_see_keys_from_their_start(*args)
        finally:
            m.undo()
            clear()
    test_rows_see_keys_from_their_start(*args)


def test_the_emulated_decode_launch_takes_starts():
    """The GPU decode lane's stand-in on the emulator (prepare_decode with backend "cpu-emulator") takes
    ``starts`` as a DecodeLaunch does, and gives decode_attention's answer for the same start."""
    mx = pytest.importorskip("mlx.core", reason="the decode lane runs on MLX arrays")
    from tqbridge.metal.attention.kernel import prepare_decode

    q, kb, vb, _ = _problem("q8_0", "turbo3", 3, 1, False, seed_of("start-lane"))
    qm, kbm, vbm = mx.array(q), mx.array(kb), mx.array(vb)
    dl = prepare_decode(qm, kbm, vbm, k_format="q8_0", v_format="turbo3", backend="cpu-emulator")
    starts = (0, 30, L)
    got = np.array(dl(qm, kbm, vbm, L, starts=starts))
    want = decode_attention(q, kb, vb, k_format="q8_0", v_format="turbo3", length=L, start=starts,
                            backend="cpu-emulator", q_precision=dl.options.q_precision)
    assert np.array_equal(got, want) and not got[2].any()
    with pytest.raises(AttentionError, match=r"start 71 of batch row 0 is outside 0\.\.70"):
        dl(qm, kbm, vbm, L, starts=(71, 0, 0))


def test_the_fuzz_target_draws_starts():
    """``tqbridge fuzz decode-attention`` explores starts: its claim says the kernel takes ``start=``, so
    its cases draw them (valid for each row's length: the oracle takes them); a user's kernel is handed
    ``start`` only where its claim says so (none drawn otherwise)."""
    from hypothesis import HealthCheck, given, settings

    from tqbridge.parity.plugin.byok import cases
    from tqbridge.parity.plugin.fuzz import our_target
    from tqbridge.parity.plugin.strategies_attention import attention_problems

    assert our_target("decode-attention", "cpu-emulator")[1].starts
    drawn = {"with": 0, "without": 0}

    @settings(max_examples=40, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(p=attention_problems(max_batch=3, max_length=40, starts=True), c=cases("decode-attention"))
    def body(p, c):
        assert "start" not in c.params
        if p.start:
            drawn["with"] += 1
            assert p.kwargs()["start"] == p.start
            p.oracle()   # check_problem accepts it
        else:
            drawn["without"] += 1
            assert "start" not in p.kwargs()

    body()
    assert drawn["with"] and drawn["without"], drawn
