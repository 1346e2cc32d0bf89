"""BatchTQCache: TQCache layers in mlx-lm's batch generation (BatchGenerator, batch_generate). Each
sequence of a batch gets what it gets alone: greedy tokens equal, teacher-forced logits within a named
tolerance; merge / extend / filter / extract move block rows exactly; an extracted TQCache owns its
buffers; windowed (Gemma 3 sliding) layers drop rows as a TQCache does; what cannot batch is refused in
one line. Planted: a left padding off by one, a filter keeping the wrong row, an extract sharing the
batch's buffer."""

from __future__ import annotations

import copy

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")

from mlx_lm.generate import BatchGenerator, batch_generate, generate_step  # noqa: E402
from mlx_lm.models import cache as mlx_cache  # noqa: E402

from tqbridge.metal.lm.cache import BatchTQCache, TQCache, install_cache, make_cache  # noqa: E402
from tqbridge.metal.lm.routing import route_attention  # noqa: E402
from tiny_models import cpu_device, tiny_gemma3, tiny_llama, tokens  # noqa: E402,F401

PAIRS = [("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "turbo3"), ("q8_0", "q4_0")]
# Teacher-forced logits of a sequence in a batch against the same sequence alone. The blocks stored from
# the prompts are the same bytes (test_a_merged_batch_stores_what_each_sequence_stores_alone); a decode
# step's K/V rows come from matmuls of another shape (B rows, not 1), so they can differ from the rows
# alone in float32's last bits, and where that crosses a rounding boundary of the stored format one
# stored value moves by a whole step: an f16 ulp, or a q8_0 scale step. Measured, OpenBLAS (system, 1-2
# threads; tests/conftest.py): the tiny Llama, q8_0/turbo3 ops lane, one q8_0 key value 35 vs 34 in layer
# 1 from inputs 1.2e-6 apart: 3.4e-4; the tiny Gemma 3, f16/f16: 4.3e-4; with no flip 2e-6 to 5e-5. With
# MLX's bundled BLAS 0. 1e-3: twice the largest flip, 500x below the planted bugs (0.54, 1.9).
STORED_FLIP_ATOL = 1e-3
# On a GPU the batch's matmuls flip more stored values (the H100, tiny Llama: f16/f16 2.2e-3, q8_0/turbo3
# 0.047): the logits comparisons run on MLX's CPU device everywhere (tiny_models.cpu_device).
PROMPTS = ((5, 0), (12, 1), (3, 2), (9, 3))     # (length, seed): left padding 7, 0, 9, 3 when merged


def _routing(routed: bool):
    return route_attention("auto") if routed else _Nothing()


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def _forced(m, cache, prompt: list, steps: list) -> np.ndarray:
    """One sequence alone: prefill ``prompt``, then the forced ``steps`` one at a time; per-step logits."""
    m(mx.array([prompt]), cache=cache)
    out = []
    for t in steps:
        lg = m(mx.array([[t]]), cache=cache)[0, -1].astype(mx.float32)
        mx.eval(lg)
        out.append(np.array(lg))
    return np.stack(out)


def prefill_and_merge(m, prompts: list) -> "tuple[list, list]":
    """Each prompt prefilled into a cache of its own, then the caches merged layer by layer
    (TQCache.merge): (the caches alone, the batch's layers)."""
    singles = []
    for p in prompts:
        c = mlx_cache.make_prompt_cache(m)
        mx.eval(m(mx.array([p]), cache=c))
        singles.append(c)
    return singles, [singles[0][i].merge([c[i] for c in singles]) for i in range(len(singles[0]))]


def batch_vs_single(m, kv: str, routed: bool, n_steps: int = 6) -> float:
    """Prefill each prompt of PROMPTS alone, merge the caches (TQCache.merge), decode the same forced
    tokens for every sequence as one batch; the largest |logit difference| against each sequence
    decoding alone."""
    install_cache(m, kv)
    prompts = [tokens(n, seed=s)[0].tolist() for n, s in PROMPTS]
    steps = [tokens(n_steps, seed=50 + i)[0].tolist() for i in range(len(prompts))]
    worst = 0.0
    with _routing(routed):
        alone = [_forced(m, mlx_cache.make_prompt_cache(m), p, s) for p, s in zip(prompts, steps)]
        _, batch = prefill_and_merge(m, prompts)
        assert all(isinstance(b, BatchTQCache) for b in batch)
        for j in range(n_steps):
            lg = m(mx.array([[s[j]] for s in steps]), cache=batch)[:, -1].astype(mx.float32)
            mx.eval(lg)
            for b in range(len(prompts)):
                worst = max(worst, float(np.abs(np.array(lg[b]) - alone[b][j]).max()))
    return worst


@pytest.mark.parametrize("routed", [False, True], ids=["ops", "routed"])
@pytest.mark.parametrize("kf,vf", PAIRS)
def test_each_row_of_a_merged_batch_decodes_as_its_sequence_alone(kf, vf, routed, cpu_device):
    worst = batch_vs_single(tiny_llama(), f"{kf}/{vf}", routed)
    assert worst <= STORED_FLIP_ATOL, worst


@pytest.mark.parametrize("kf,vf", PAIRS)
def test_a_merged_batch_stores_what_each_sequence_stores_alone(kf, vf, monkeypatch):
    """Byte for byte: every prompt row of a merged batch holds the blocks its sequence stored alone, and
    every decoded row holds what a TQCache of its own stores when handed that row's K/V floats. (A
    batch's projections are matmuls of another shape, so those floats can differ in the last bits from
    the sequence's alone; where that crosses a rounding boundary one stored value flips, which is what
    STORED_FLIP_ATOL bounds in the logits.)"""
    m = tiny_llama()
    install_cache(m, f"{kf}/{vf}")
    handed = []
    real = BatchTQCache.update_and_fetch

    def keep(self, keys, values):
        handed.append((self, np.array(keys), np.array(values)))
        return real(self, keys, values)
    prompts = [tokens(n, seed=s)[0].tolist() for n, s in PROMPTS]
    steps = [tokens(3, seed=50 + i)[0].tolist() for i in range(len(prompts))]
    alone, batch = prefill_and_merge(m, prompts)
    monkeypatch.setattr(BatchTQCache, "update_and_fetch", keep)
    for j in range(len(steps[0])):
        mx.eval(m(mx.array([[s[j]] for s in steps]), cache=batch))
    monkeypatch.undo()
    for layer, bc in enumerate(batch):
        bk, bv = (np.array(x) for x in bc.blocks())
        pads = np.array(bc.left_padding).tolist()
        rows = [(k, v) for c, k, v in handed if c is bc]
        assert len(rows) == len(steps[0])
        for b, p in enumerate(prompts):
            ak, av = (np.array(x)[0] for x in alone[b][layer].blocks())
            got_k = bk[b, :, pads[b]:pads[b] + len(p) + len(rows)]
            got_v = bv[b, :, pads[b]:pads[b] + len(p) + len(rows)]
            np.testing.assert_array_equal(got_k[:, :len(p)], ak, err_msg=f"prompt K, layer {layer} row {b}")
            np.testing.assert_array_equal(got_v[:, :len(p)], av, err_msg=f"prompt V, layer {layer} row {b}")
            own = mlx_cache.make_prompt_cache(m)[layer]
            for k, v in rows:
                own.update_and_fetch(mx.array(k[b:b + 1]), mx.array(v[b:b + 1]))
            ok, ov = (np.array(x)[0] for x in own.blocks())
            np.testing.assert_array_equal(got_k[:, len(p):], ok, err_msg=f"decoded K, layer {layer} row {b}")
            np.testing.assert_array_equal(got_v[:, len(p):], ov, err_msg=f"decoded V, layer {layer} row {b}")


@pytest.mark.parametrize("routed", [False, True], ids=["ops", "routed"])
@pytest.mark.parametrize("kf,vf", [("f16", "f16"), ("q8_0", "turbo3")])
def test_windowed_rows_merged_after_their_windows_slid_decode_as_alone(kf, vf, routed, monkeypatch, cpu_device):
    """Gemma 3, sliding layers of 8 positions dropping rows 4 at a time: the 12-token prompt's windowed
    layers have dropped rows (start > 0) before the merge, the batch drops more while it decodes."""
    monkeypatch.setattr(TQCache, "step", 4)
    monkeypatch.setattr(BatchTQCache, "step", 4)
    worst = batch_vs_single(tiny_gemma3(window=8), f"{kf}/{vf}", routed, n_steps=10)
    assert worst <= STORED_FLIP_ATOL, worst


def test_planted_left_padding_off_by_one_is_caught(monkeypatch, cpu_device):
    real = BatchTQCache.make_mask

    def off_by_one(self, N, **kw):
        saved = self.left_padding
        self.left_padding = mx.maximum(saved - 1, 0)
        try:
            return real(self, N, **kw)
        finally:
            self.left_padding = saved
    monkeypatch.setattr(BatchTQCache, "make_mask", off_by_one)
    assert batch_vs_single(tiny_llama(), "q8_0/turbo3", False) > 100 * STORED_FLIP_ATOL   # measured 0.54


# The fused kernel on the emulated decode lane against the sequences alone (which decode through the
# same kernel, one row each): the accumulation order differs with the splits of a longer stored row, a
# few float32 ulps of each output (tests/test_attention_start.py: SLICED_EXACT_ULPS); through the tiny
# model's logits measured 3.6e-5 (q8_0/turbo3), 3.2e-6 (f16/f16); with a stored flip STORED_FLIP_ATOL.
@pytest.mark.parametrize("kf,vf", [("q8_0", "turbo3"), ("f16", "f16")])
def test_a_batch_decodes_through_the_fused_kernel_with_per_row_starts(kf, vf, cpu_device):
    """Routed, on the emulated GPU decode lane: a batch's decode steps run the fused kernel (not the
    dequantize path), each sequence from its left padding on, and give each row its logits alone."""
    from tqbridge.metal.backend import emulate_decode_lane

    with emulate_decode_lane():
        m = tiny_llama()
        worst = batch_vs_single(m, f"{kf}/{vf}", True, n_steps=3)
    assert worst <= STORED_FLIP_ATOL, worst
    paths = batch_paths(m, f"{kf}/{vf}")
    assert paths.get("decode:cpu-emulator", 0) > 0 and not paths.get("decode:dequant-sdpa"), paths


def test_windowed_rows_decode_on_the_lane_as_alone(cpu_device, monkeypatch):
    """The emulated GPU lane (in-place appends, the fused kernel with per-row starts) on Gemma 3's sliding
    layers of 8 positions dropping rows 4 at a time, before and after the merge: each row as alone."""
    from tqbridge.metal.backend import emulate_decode_lane

    monkeypatch.setattr(TQCache, "step", 4)
    monkeypatch.setattr(BatchTQCache, "step", 4)
    with emulate_decode_lane():
        worst = batch_vs_single(tiny_gemma3(window=8), "q8_0/turbo3", True, n_steps=10)
    assert worst <= STORED_FLIP_ATOL, worst   # measured 2.8e-6


def batch_paths(m, kv: str) -> dict:
    """The attention paths a merged batch's decode steps took (emulated lane, routed)."""
    from collections import Counter

    from tqbridge.metal.backend import emulate_decode_lane

    install_cache(m, kv)
    prompts = [tokens(n, seed=s)[0].tolist() for n, s in PROMPTS]
    with emulate_decode_lane(), route_attention("auto"):
        _, batch = prefill_and_merge(m, prompts)
        for b in batch:
            b.template.paths.clear()
        mx.eval(m(mx.array([[1]] * len(prompts)), cache=batch))
    return dict(sum((Counter(b.template.paths) for b in batch), Counter()))


def test_planted_fused_start_off_by_one_is_caught(cpu_device, monkeypatch):
    """Planted: the fused batch step's per-row starts one row late (each sequence loses its first key):
    measured 1.9."""
    from tqbridge.metal.backend import emulate_decode_lane

    real = BatchTQCache._starts
    monkeypatch.setattr(BatchTQCache, "_starts", lambda self: tuple(x + 1 for x in real(self)))
    with emulate_decode_lane():
        worst = batch_vs_single(tiny_llama(), "q8_0/turbo3", True, n_steps=2)
    assert worst > 100 * STORED_FLIP_ATOL, worst


def _generate(m, prompts, max_tokens, routed, **kw):
    """Greedy tokens of each prompt alone (generate_step) and through BatchGenerator (every sequence in
    one batch, a second half inserted while the first decodes)."""
    alone = []
    with _routing(routed):
        for p in prompts:
            c = mlx_cache.make_prompt_cache(m)
            alone.append([int(t) for t, _ in zip((t for t, _ in generate_step(mx.array(p), m, prompt_cache=c,
                                                                             max_tokens=max_tokens)),
                                                 range(max_tokens))])
        gen = BatchGenerator(m, max_tokens=max_tokens, **kw)
        half = len(prompts) // 2
        uids = gen.insert(prompts[:half])
        got: dict = {}
        seen = []
        for step in range(10_000):
            if step == 2:
                uids += gen.insert(prompts[half:])
            r = gen.next_generated()
            seen += [(c.offset.shape[0], c.window, c.dropped, c._idx) for c in gen._generation_batch.prompt_cache]
            if not r and step > 2:
                break
            for x in r:
                got.setdefault(x.uid, []).append(x.token)
        gen.close()
    return alone, [got[u] for u in uids], seen


@pytest.mark.parametrize("routed", [False, True], ids=["ops", "routed"])
@pytest.mark.parametrize("kf,vf", PAIRS)
def test_batch_generator_gives_each_sequence_its_greedy_tokens(kf, vf, routed, cpu_device):
    m = tiny_llama()
    install_cache(m, f"{kf}/{vf}")
    prompts = [tokens(n, seed=s)[0].tolist() for n, s in PROMPTS]
    alone, batched, seen = _generate(m, prompts, 10, routed, prefill_batch_size=2, completion_batch_size=4,
                                     prefill_step_size=4)
    assert batched == alone
    assert max(b for b, *_ in seen) >= 3   # several sequences decoded as one batch


@pytest.mark.parametrize("kf,vf", PAIRS)
def test_batch_generate_with_tqcache_layers(kf, vf, cpu_device):
    m = tiny_llama()
    install_cache(m, f"{kf}/{vf}")
    prompts = [tokens(n, seed=s)[0].tolist() for n, s in PROMPTS]
    out = batch_generate(m, _Tok(), prompts, max_tokens=5, return_prompt_caches=True)
    theirs = batch_generate(tiny_llama(), _Tok(), prompts, max_tokens=5, return_prompt_caches=True)
    assert len(out.texts) == len(prompts) and all(len(t.split()) == 5 for t in out.texts)
    if kf == "f16":
        assert out.texts == theirs.texts
    for mine, own in zip(out.caches, theirs.caches):   # what mlx-lm's own batch cache holds (the last token too)
        assert [(type(c), c.offset) for c in mine] == [(TQCache, o.offset) for o in own]


class _Tok:
    """The least of a tokenizer batch_generate needs: tokens as words."""
    eos_token_ids: set = set()

    class detokenizer:
        def __init__(self):
            self.text = ""

        def reset(self):
            self.text = ""

        def add_token(self, t):
            self.text += f"{t} "

        def finalize(self):
            pass

        @property
        def last_segment(self):
            s, self.text = self.text, ""
            return s

    def __init__(self):
        self.detokenizer = _Tok.detokenizer()

    def decode(self, toks):
        return " ".join(map(str, toks))


@pytest.mark.parametrize("routed", [False, True], ids=["ops", "routed"])
@pytest.mark.parametrize("kv", ["f16/f16", "q8_0/turbo3", "q8_0/q4_0"])
def test_windowed_layers_batch_and_drop_rows_as_a_tqcache(kv, routed, monkeypatch, cpu_device):
    """Gemma 3 (sliding layers of 8 positions); rows dropped 4 at a time (``step``), prompts long
    enough that a right-padded prompt spans a drop."""
    monkeypatch.setattr(TQCache, "step", 4)
    monkeypatch.setattr(BatchTQCache, "step", 4)
    m = tiny_gemma3(window=8)
    install_cache(m, kv)
    prompts = [tokens(n, seed=s)[0].tolist() for n, s in ((5, 0), (30, 1), (3, 2), (21, 3), (9, 4))]
    alone, batched, seen = _generate(m, prompts, 16, routed, prefill_batch_size=2, completion_batch_size=3,
                                     prefill_step_size=7)
    assert batched == alone
    windowed = [(dropped, idx) for _, window, dropped, idx in seen if window]
    assert windowed and max(d for d, _ in windowed) > 0
    assert max(i for _, i in windowed) <= 8 - 1 + 4 + 7   # window - 1 + step + a chunk


# ---- rows moved exactly ------------------------------------------------------------------------------

def _rows(seed, n, d=64, h=2):
    return mx.array(np.random.default_rng(seed).standard_normal((1, h, n, d)).astype(np.float32))


def _cache(kf, vf, n, seed, **kw):
    c = TQCache(kf, vf, **kw)
    if n:
        c.update_and_fetch(_rows(seed, n), _rows(seed + 100, n))
    return c


def _bytes(c):
    if c.keys is None:
        return b""
    kb, vb = c.blocks()
    return np.array(kb).tobytes() + np.array(vb).tobytes()


def round_trip_errors(singles, batch) -> list:
    """What differs between each single cache and the batch row extracted for it: block bytes, offsets,
    or a buffer the extract shares with the batch."""
    bad = []
    for i, c in enumerate(singles):
        e = batch.extract(i)
        if (_bytes(e), e.offset, e.start) != (_bytes(c), c.offset, c.start):
            bad.append(f"row {i}: blocks or positions differ")
        for mine, theirs in ((e.keys, batch.keys), (e.values, batch.values)):
            if mine is None:
                continue
            mx.eval(mine, theirs)
            if np.shares_memory(np.array(mine, copy=False), np.array(theirs, copy=False)):
                bad.append(f"row {i}: the extracted cache shares the batch's buffer")
    return bad


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("kf,vf", PAIRS)
def test_merge_extend_filter_extract_move_block_rows_exactly(kf, vf, window):
    a = [_cache(kf, vf, n, s, window=window) for n, s in ((5, 1), (0, 2), (9, 3))]
    b = [_cache(kf, vf, n, s, window=window) for n, s in ((2, 4), (12, 5))]
    batch = TQCache.merge(a)
    assert batch.left_padding.tolist() == [4, 9, 0] and batch.offset.tolist() == [5, 0, 9]
    assert round_trip_errors(a, batch) == []
    batch.extend(TQCache.merge(b))
    assert round_trip_errors(a + b, batch) == []
    keep = [4, 0, 2]
    batch.filter(keep)
    assert round_trip_errors([(a + b)[i] for i in keep], batch) == []
    assert min(batch.left_padding.tolist()) == 0     # padding columns every row shares are dropped
    twin = copy.deepcopy(batch)
    twin.update_and_fetch(mx.repeat(_rows(9, 1, h=2), 3, axis=0), mx.repeat(_rows(10, 1), 3, axis=0))
    assert round_trip_errors([(a + b)[i] for i in keep], batch) == []   # the original is untouched


def test_planted_filter_keeping_the_wrong_row_is_caught(monkeypatch):
    real = BatchTQCache.filter
    monkeypatch.setattr(BatchTQCache, "filter", lambda self, keep: real(self, [keep[-1]] + list(keep[1:])))
    a = [_cache("q8_0", "turbo3", n, s) for n, s in ((5, 1), (7, 2), (9, 3))]
    batch = TQCache.merge(a)
    batch.filter([0, 2])
    assert round_trip_errors([a[0], a[2]], batch) != []


def test_planted_extract_sharing_the_batch_buffer_is_caught(monkeypatch):
    def sharing(self, idx):
        c = TQCache(self.k_format, self.v_format)
        t = self.template
        c.k_dim, c.v_dim, c.k_rot, c.v_rot = t.k_dim, t.v_dim, t.k_rot, t.v_rot
        # no copy when the row is the whole buffer
        c.decoder.load(mx.contiguous(self.keys[idx:idx + 1]), mx.contiguous(self.values[idx:idx + 1]), self._idx, 0)
        return c
    monkeypatch.setattr(BatchTQCache, "extract", sharing)
    a = [_cache("q8_0", "turbo3", 256, 1)]
    assert any("shares" in e for e in round_trip_errors(a, TQCache.merge(a)))


def test_an_extracted_cache_decodes_on_without_touching_the_batch():
    a = [_cache("q8_0", "q4_0", n, s) for n, s in ((5, 1), (8, 2))]
    batch = TQCache.merge(a)
    e = batch.extract(0)
    before = [np.array(x) for x in batch.blocks()]
    e.trim(2)
    e.update_and_fetch(_rows(7, 3), _rows(8, 3))
    assert all(np.array_equal(x, np.array(y)) for x, y in zip(before, batch.blocks()))
    batch.trim(1)
    batch.update_and_fetch(mx.repeat(_rows(3, 1), 2, axis=0), mx.repeat(_rows(4, 1), 2, axis=0))
    assert e.offset == 6 and _bytes(e)[:10] == _bytes(_cache("q8_0", "q4_0", 5, 1))[:10]


# ---- the decode lane: rows appended in place ------------------------------------------------------------

def _lane_steps(batch, seeds, lane: bool) -> None:
    """Decode steps of ``batch``: one K/V row per sequence from each seed, through the routing (the lane:
    in-place appends on the emulator) or through MLX ops (no routing)."""
    from tqbridge.metal.backend import emulate_decode_lane

    B = batch.offset.shape[0]
    for s in seeds:
        k, v = _rows(s, 1, h=2), _rows(s + 1000, 1, h=2)
        k, v = mx.concatenate([k * (i + 1) for i in range(B)]), mx.concatenate([v - i for i in range(B)])
        if lane:
            with emulate_decode_lane(), route_attention("auto"):
                batch.update_and_fetch(k, v)
        else:
            batch.update_and_fetch(k, v)


@pytest.mark.parametrize("kf,vf", [("q8_0", "turbo3"), ("f16", "f16"), ("q8_0", "q4_0")])
def test_the_lane_appends_in_place_the_bytes_mlx_ops_store(kf, vf, cpu_device):
    """Emulated GPU lane: a merged batch's decode steps write their rows with the in-place append kernel
    (the merged buffers copied once into its own), byte for byte what the MLX-ops append stores from the
    same rows; filter, extract, a deep copy and a later MLX-ops step see every row."""
    a = [_cache(kf, vf, n, s) for n, s in ((5, 1), (9, 2), (3, 3))]
    lane, ops = TQCache.merge(a), TQCache.merge(a)
    lane.template.paths.clear()
    _lane_steps(lane, (11, 12, 13), True)
    _lane_steps(ops, (11, 12, 13), False)
    assert lane.template.paths["append:in-place"] == 3
    assert _bytes(lane) == _bytes(ops) and lane._idx == ops._idx == 12
    twin = copy.deepcopy(lane)
    _lane_steps(twin, (20,), True)
    _lane_steps(lane, (14,), False)     # a step off the lane after in-place ones
    _lane_steps(ops, (14,), False)
    assert _bytes(lane) == _bytes(ops), "the original after its twin decoded"
    for x in (lane, ops):
        x.filter([2, 0])
    _lane_steps(lane, (15,), True)
    _lane_steps(ops, (15,), False)
    assert _bytes(lane) == _bytes(ops)
    assert _bytes(lane.extract(1)) == _bytes(ops.extract(1))


@pytest.mark.parametrize("kv", ["q8_0/turbo3", "q8_0/q4_0"])
@pytest.mark.gpu
def test_gpu_batch_step_on_the_lane_keeps_its_kernels_and_no_sync(kv, gpu_device):
    """A merged batch's decode steps on a GPU: the in-place append, pass 1 and the combine (and the offset's
    add), no host synchronisation; the stored bytes those of the MLX-ops append from the same rows."""
    from tqbridge.bridge.blocks.kv_spec import split_kv
    from tqbridge.metal.lm.decode_bench import count_syncs, graph_primitives, is_view

    kf, vf = split_kv(kv)
    a = [_cache(kf, vf, n, s) for n, s in ((5, 1), (9, 2), (3, 3))]
    lane, ops = TQCache.merge(a), TQCache.merge(a)
    q = mx.array(np.random.default_rng(3).standard_normal((3, 4, 1, 64)).astype(np.float32))
    for i in range(5):
        k = mx.concatenate([_rows(30 + i, 1, h=2) * (b + 1) for b in range(3)])
        v = mx.concatenate([_rows(60 + i, 1, h=2) - b for b in range(3)])
        mx.eval(k, v)
        with route_attention("auto"), count_syncs() as n:
            kk, vv = lane.update_and_fetch(k, v)
            out = lane.attend(q, scale=0.125, mode="auto")
        # the first step reads the batch's left padding once and runs the kernels' first-use self-check
        assert i == 0 or n["n"] == 0, f"{kv}: {n['n']} host synchronisations in step {i}"
        t = lane.template
        assert lane._flag is not None, f"{kv}: step {i} off the lane: {dict(t.paths)} {dict(t.codec_paths)}"
        if i > 1:   # the first steps copy the merged buffers once and materialise the flag
            kernels = [p for p in graph_primitives(out, lane._flag, lane.offset) if not is_view(p)]
            assert len(kernels) <= 4, f"{kv}: {kernels}"
        mx.eval(out, lane.offset)
        ops.update_and_fetch(k, v)     # not routed: MLX ops quantize and slice
    assert lane.template.paths["append:in-place"] == 5
    # the bytes the ops path wrote, up to the rotation's rounding (the kernel's butterfly against MLX's
    # matmul on the GPU), as for a single sequence (test_decode_step.py)
    got, want = np.frombuffer(_bytes(lane), np.uint8), np.frombuffer(_bytes(ops), np.uint8)
    assert got.shape == want.shape and np.mean(got != want) < 0.02


def test_nonfinite_rows_appended_in_place_are_reported_when_read(cpu_device):
    from tqbridge.bridge import FormatError

    batch = TQCache.merge([_cache("q8_0", "turbo3", n, s) for n, s in ((4, 1), (6, 2))])
    k = mx.concatenate([_rows(1, 1), mx.full((1, 2, 1, 64), float("nan"))])
    from tqbridge.metal.backend import emulate_decode_lane

    with emulate_decode_lane(), route_attention("auto"):
        batch.update_and_fetch(k, mx.concatenate([_rows(2, 1)] * 2))
    assert batch.template.paths["append:in-place"] == 1
    with pytest.raises(FormatError, match="NaN or infinite"):
        batch.blocks()


# ---- masks and the protocol's small parts ---------------------------------------------------------------

def test_mask_after_a_right_padded_prompt_masks_the_padding_rows():
    batch = TQCache.merge([TQCache("q8_0", "turbo3") for _ in range(2)])
    batch.prepare(lengths=[3, 5], right_padding=[2, 0])
    batch.update_and_fetch(mx.repeat(_rows(1, 5), 2, axis=0), mx.repeat(_rows(2, 5), 2, axis=0))
    batch.finalize()
    assert batch.left_padding.tolist() == [2, 0] and batch.offset.tolist() == [3, 5]
    mask = np.array(batch.make_mask(1))
    assert mask.shape == (2, 1, 1, 6)
    assert mask[0, 0, 0].tolist() == [False, False, True, True, True, True] and mask[1].all()
    rows = np.array(batch.blocks()[0])
    assert np.array_equal(rows[0, :, 2:], rows[1, :, :3])   # the rolled rows are the first three
    assert batch.is_trimmable() and batch.trim(1) == 1 and batch.offset.tolist() == [2, 4]
    mx.eval([c for c in batch.state])
    assert batch.nbytes == batch.keys.nbytes + batch.values.nbytes and not batch.empty()


@pytest.mark.parametrize("why,caches,says", [
    ("pairs", lambda: [_cache("q8_0", "turbo3", 3, 1), _cache("q8_0", "q4_0", 3, 2)], "differ in pair"),
    ("windows", lambda: [_cache("f16", "f16", 3, 1, window=4), _cache("f16", "f16", 3, 2)], "differ in pair"),
    ("rotations", lambda: [_cache("q8_0", "q8_0", 3, 1), _cache("q8_0", "q8_0", 3, 2, rotation="none")],
     "rotation"),
    ("dims", lambda: [_cache("f16", "f16", 3, 1), _dims()], "head dims"),
    ("kinds", lambda: [_cache("f16", "f16", 3, 1), mlx_cache.KVCache()], "is not a TQCache"),
    ("calibrated", lambda: [_cache("q8_0", "q8_0", 3, 1, calibration="mean"),
                            _cache("q8_0", "q8_0", 3, 2, calibration="mean")], "another key calibration"),
    ("unfitted", lambda: [TQCache("q8_0", "q8_0", calibration="mean")], "from its own first keys"),
])
def test_what_cannot_batch_is_refused_in_one_line(why, caches, says):
    with pytest.raises(ValueError, match=says) as e:
        TQCache.merge(caches())
    assert "\n" not in str(e.value)


def _dims():
    c = TQCache("f16", "f16")
    x = mx.zeros((1, 2, 3, 128))
    c.update_and_fetch(x, x)
    return c


def test_identical_calibrations_batch():
    c = _cache("q8_0", "q8_0", 6, 1, calibration="mean+scale")
    twin = copy.deepcopy(c)
    batch = TQCache.merge([c, twin])
    assert round_trip_errors([c, twin], batch) == []


def test_mlx_lms_own_batch_cache_still_refuses_tqcache_layers():
    with pytest.raises(ValueError, match=r"holds quantized blocks, not K/V rows; batch TQCache layers with TQCache"):
        mlx_cache.BatchKVCache.merge([_cache("q8_0", "turbo3", 3, 1)])


def test_a_model_cache_batches_through_make_cache():
    m = tiny_llama()
    caches = [make_cache(m, "q8_0", "turbo3") for _ in range(2)]
    batch = [caches[0][i].merge([c[i] for c in caches]) for i in range(2)]
    assert [type(b) for b in batch] == [BatchTQCache, BatchTQCache] and batch[0].empty()


# The fused batch step against mlx-lm's attention on the same batch's dequantized rows with the batch mask,
# one decode step, the same q: both attend to the same quantized keys and values, so they differ by the
# kernel's float32 rounding; measured on the emulated lane: 3.2e-7 (q8_0/turbo3), 1.8e-7 (f16/f16), 1.7e-7
# (q8_0/q4_0) of max |output|. 1e-4: 300x that; the starts one row late measured 1.4.
FUSED_VS_OPS_RTOL = 1e-4


@pytest.mark.parametrize("kf,vf", [("q8_0", "turbo3"), ("f16", "f16"), ("q8_0", "q4_0")])
def test_the_fused_batch_step_equals_mlx_lms_attention_on_the_same_rows(kf, vf):
    """One merged batch (left padding 7, 0, 9, 3), one decode step's q: the fused kernel with per-row starts
    (on a GPU, or the emulated lane on a CPU) against ``mx.fast.scaled_dot_product_attention`` on the
    dequantized rows with the batch's mask."""
    from tqbridge.metal.backend import emulate_decode_lane

    caches = [_cache(kf, vf, n, s) for n, s in PROMPTS]
    batch = TQCache.merge(caches)
    rng = np.random.default_rng(11)
    q = mx.array(rng.standard_normal((len(PROMPTS), 4, 1, 64)).astype(np.float32))
    with emulate_decode_lane():
        k, v = _rows(21, 1, h=2).astype(mx.float32), _rows(22, 1, h=2).astype(mx.float32)
        k, v = mx.concatenate([k] * len(PROMPTS)), mx.concatenate([v] * len(PROMPTS))
        mask = batch.make_mask(1)
        batch.update_and_fetch(k, v)
        fused = batch.attend(q, scale=0.125, mask=mask, mode="auto")
        ops = batch.attend(q, scale=0.125, mask=mask, mode="sdpa")
    paths = batch.template.paths
    assert any(p.startswith("decode:") and p != "decode:dequant-sdpa" for p in paths), dict(paths)
    scale = float(mx.abs(ops).max())
    err = float(mx.abs(fused - ops).max())
    assert err <= FUSED_VS_OPS_RTOL * scale, (err, scale)


def test_the_cache_report_names_a_batchs_layers(cpu_device):
    """cache_report / paths_line on a batch's layers (what bench serve records): the pair, the batch size and
    the paths its steps ran (here the emulated lane: the in-place append, the fused kernel), not "float"."""
    from tqbridge.metal.backend import emulate_decode_lane
    from tqbridge.metal.lm.report import cache_report, paths_line

    m = tiny_llama()
    paths = batch_paths(m, "q8_0/turbo3")
    assert paths.get("decode:cpu-emulator") == 2, paths
    install_cache(m, "q8_0/turbo3")
    with emulate_decode_lane(), route_attention("auto"):
        _, batch = prefill_and_merge(m, [tokens(n, seed=s)[0].tolist() for n, s in PROMPTS])
        mx.eval(m(mx.array([[1]] * len(PROMPTS)), cache=batch))
    layers = cache_report(batch)["layers"]
    assert [(l["kind"], l["kv"], l["batch"]) for l in layers] == [("tqbridge-batch", "q8_0/turbo3", 4)] * 2, layers
    assert all(l["decode_kernel"]["backend"] == "cpu-emulator" for l in layers), layers
    line = paths_line(batch)
    assert "decode:cpu-emulator x2" in line and "kv-append:cpu-emulator" in line, line
