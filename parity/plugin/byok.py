"""Bring your own kernel: fuzz a callable that claims quantize, dequantize, append or decode attention
for a format (pair) against tqbridge's reference, and report the shrunk counterexample as a runnable
snippet.

Call conventions (numpy or MLX arrays in, either out):

================  ========================================================  =========================
op                call                                                      judged against
================  ========================================================  =========================
quantize          ``fn(x)`` x: float32 (rows, n) → uint8 (rows, row_bytes)   ``bridge.quantize``, bytes
append            ``fn(rows)`` rows: (B, Hkv, n_new, D_padded) → blocks      ``bridge.quantize``, bytes
dequantize        ``fn(blocks, n)`` → float32 (rows, n)                      ``bridge.dequantize``
decode-attention  ``fn(q, k_blocks, v_blocks, *, k_format, v_format,         float64 oracle and bound
                  length, scale, window, softcap, sinks)``
================  ========================================================  =========================

A callable claiming several formats (``fmt=None`` or a list) is called with an extra ``fmt=``
keyword. Turbo dequantization is judged within :data:`TURBO_DEQUANT_ULPS` roundings of the row norm
(an inverse rotation may add in any order); every other dequantization must be exact.

Usage::

    from tqbridge.parity.plugin.byok import fuzz_kernel
    result = fuzz_kernel(my_dequantizer, "dequantize", fmt=FORMAT, max_examples=200)
    assert result.ok, result.report()

with ``FORMAT`` the registered name your dequantizer claims (docs/plugin.md, "Bring your own kernel").
"""

from __future__ import annotations

import base64
import io
import json
import math
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from hypothesis import HealthCheck, given, settings, target
from hypothesis import seed as hyp_seed
from hypothesis import strategies as st

from ... import bridge
from ...bridge.blocks.padding import pad_rows
from ...metal.attention.problem import to_numpy
from .assertions import assert_attention_close, assert_blocks_equal, assert_values_close

OPS = ("quantize", "dequantize", "append", "decode-attention")
U32 = 2.0 ** -24
#: Turbo dequantization: allowed |error| per value = this many float32 roundings per butterfly stage
#: (log2(group) stages + 2 scalings) times the row's 2-norm: the inverse rotation is orthonormal, so
#: each stage's rounding moves the vector by at most u * its norm (derivation: metal/attention/ref.py).
TURBO_DEQUANT_ULPS = 2.0


class KernelClaimError(ValueError):
    """The claim (op, formats) is malformed; the message says how."""


@dataclass
class Case:
    """One fuzzed input: the op, its format(s), its arrays and scalar options. Serialisable to text."""

    op: str
    formats: tuple[str, ...]
    arrays: dict
    params: dict = field(default_factory=dict)

    @property
    def shape(self) -> tuple:
        a = self.arrays
        if self.op == "decode-attention":
            q, kb = a["q"], a["k_blocks"]
            t = 1 if q.ndim == 3 else q.shape[2]
            return (q.shape[0], q.shape[1], kb.shape[1], t, q.shape[-1], kb.shape[2])
        return tuple(next(iter(a.values())).shape)

    def to_text(self) -> str:
        """A compact ASCII form (zlib + base64 of an .npz); :meth:`from_text` reads it back."""
        buf = io.BytesIO()
        np.savez(buf, **self.arrays)
        meta = json.dumps({"op": self.op, "formats": list(self.formats), "params": self.params})
        blob = zlib.compress(meta.encode() + b"\n" + buf.getvalue(), 9)
        return base64.b64encode(blob).decode()

    @classmethod
    def from_text(cls, text: str) -> "Case":
        raw = zlib.decompress(base64.b64decode("".join(text.split())))
        meta, _, npz = raw.partition(b"\n")
        m = json.loads(meta)
        with np.load(io.BytesIO(npz)) as z:
            arrays = {k: z[k] for k in z.files}
        return cls(m["op"], tuple(m["formats"]), arrays, m["params"])

    def _repr_pretty_(self, p, cycle) -> None:   # hypothesis and IPython print this
        p.text(repr(self))

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={v.shape}" for k, v in self.arrays.items())
        opts = "".join(f", {k}={v!r}" for k, v in self.params.items() if v is not None)
        return f"Case({self.op}, {'/'.join(self.formats)}, {shapes}{opts})"


@dataclass(frozen=True)
class Claim:
    """What a kernel says it implements."""

    op: str
    formats: "tuple[str, ...] | None" = None            # quantize / dequantize / append
    k_formats: "tuple[str, ...] | None" = None          # decode-attention
    v_formats: "tuple[str, ...] | None" = None
    chain: "Callable[[], int] | None" = None            # longest serial sum of the last call (attention)
    q_precision: "Callable[[], str] | None" = None      # how the last call's q entered the scores (attention)
    starts: bool = False                                # attention: the kernel takes start= (rows' left padding)

    @property
    def pass_format(self) -> bool:
        return self.formats is None or len(self.formats) != 1


def _keys(v) -> "tuple[str, ...] | None":
    if v is None:
        return None
    vals = [v] if isinstance(v, str) else list(v)
    try:
        return tuple(bridge.get_format(x).key for x in vals)
    except bridge.FormatError as e:
        raise KernelClaimError(str(e)) from None


def make_claim(op: str, fmt: Any = None, *, k_format: Any = None, v_format: Any = None,
               chain: "Callable[[], int] | None" = None, q_precision: "Callable[[], str] | None" = None,
               starts: bool = False) -> Claim:
    if op not in OPS:
        raise KernelClaimError(f"unknown op {op!r}; a kernel can claim one of {', '.join(OPS)}")
    if op == "decode-attention":
        if fmt is not None:
            raise KernelClaimError("decode-attention claims a format pair: use k_format= and v_format=")
        return Claim(op, None, _keys(k_format), _keys(v_format), chain, q_precision, bool(starts))
    if k_format is not None or v_format is not None:
        raise KernelClaimError(f"{op} claims one format: use fmt=, not k_format/v_format")
    return Claim(op, _keys(fmt), chain=chain)


def claims(op: str, fmt: Any = None, *, k_format: Any = None, v_format: Any = None):
    """Decorator recording what a kernel implements, read by ``tqbridge fuzz module:function``."""
    c = make_claim(op, fmt, k_format=k_format, v_format=v_format)

    def wrap(fn):
        fn.__tqbridge_claim__ = c
        return fn

    return wrap


# ----------------------------------------------------------------------------------- strategies


def cases(op: str, fmt: Any = None, *, k_format: Any = None, v_format: Any = None, max_rows: int = 3,
          max_blocks: int = 4, max_length: int = 160, starts: bool = False) -> st.SearchStrategy[Case]:
    """:class:`Case` inputs for ``op`` on the claimed format(s) (default: every registered format);
    ``starts`` (decode-attention): draw per-row starts too, for a kernel that takes ``start=``."""
    from .strategies import float_rows
    from .strategies_attention import attention_problems
    from .strategies_blocks import blocks, kv_caches

    c = make_claim(op, fmt, k_format=k_format, v_format=v_format)
    every = tuple(f.key for f in bridge.all_formats())
    fmts = c.formats or every
    if op == "decode-attention":
        return attention_problems(k_formats=c.k_formats, v_formats=c.v_formats, max_length=max_length,
                                  max_query_rows=4, starts=starts).map(
            lambda p: Case(op, (p.k_format, p.v_format),
                           {k: v for k, v in (("q", p.q), ("k_blocks", p.k_blocks), ("v_blocks", p.v_blocks),
                                              ("sinks", p.sinks)) if v is not None},
                           {"length": list(p.length) if isinstance(p.length, tuple) else p.length,
                            "scale": p.scale, "window": p.window, "softcap": p.softcap}
                           | ({"start": list(p.start) if isinstance(p.start, tuple) else p.start} if p.start else {})))

    def for_format(key: str) -> st.SearchStrategy[Case]:
        f = bridge.get_format(key)
        if op == "quantize":
            bs = f.block_size if f.kind != "float" else 32
            top = max_blocks if f.kind != "float" else 2
            return st.integers(1, top).flatmap(lambda k: st.lists(
                float_rows(block_size=bs, min_blocks=k, max_blocks=k), min_size=1, max_size=max_rows)).map(
                lambda rs: Case(op, (key,), {"x": np.stack(rs)}))
        if op == "dequantize":
            return blocks(fmt=key, max_rows=max_rows, max_blocks=max_blocks).map(
                lambda b: Case(op, (key,), {"blocks": b}, {"n": b.shape[1] // f.type_size * f.block_size}))
        return kv_caches(k_formats=[key], v_formats=[key], max_steps=3, max_step_rows=5).map(
            lambda kv: Case(op, (key,), {f"k{i}": pad_rows(f, s[0]) for i, s in enumerate(kv.steps)}
                            | {f"v{i}": pad_rows(f, s[1]) for i, s in enumerate(kv.steps)}))

    return st.sampled_from(fmts).flatmap(for_format)


# ----------------------------------------------------------------------------------- checking


def _call(fn: Callable, claim: Claim, fmt: str, *args, **kwargs):
    if claim.pass_format:
        kwargs["fmt"] = fmt
    return fn(*args, **kwargs)


def _tuple(x):
    """A JSON list back as the tuple it was (a per-row length or start)."""
    return tuple(x) if isinstance(x, list) else x


def check_case(fn: Callable, case: Case, claim: "Claim | None" = None) -> float:
    """Run ``fn`` on ``case`` and judge it; raise ``AssertionError`` with a message naming what differs.
    Returns the worst ratio error / allowed (0 for exact agreement)."""
    claim = claim or getattr(fn, "__tqbridge_claim__", None) or make_claim(
        case.op, None if case.op == "decode-attention" else case.formats[0],
        k_format=case.formats[0] if case.op == "decode-attention" else None,
        v_format=case.formats[1] if case.op == "decode-attention" else None)
    a, op = case.arrays, case.op
    if op == "quantize":
        fmt = case.formats[0]
        assert_blocks_equal(_call(fn, claim, fmt, a["x"]), bridge.quantize(fmt, a["x"]), fmt, context="quantize")
        return 0.0
    if op == "append":
        fmt = case.formats[0]
        for name in sorted(a, key=lambda s: (s[0], int(s[1:]))):
            rows = a[name]
            assert_blocks_equal(_call(fn, claim, fmt, rows), bridge.quantize(fmt, rows), fmt,
                                context=f"append step {name[1:]}, {'K' if name[0] == 'k' else 'V'} rows {rows.shape}")
        return 0.0
    if op == "dequantize":
        fmt = bridge.get_format(case.formats[0])
        n = int(case.params["n"])
        want = bridge.dequantize(fmt, a["blocks"], n)
        got = to_numpy(_call(fn, claim, fmt.key, a["blocks"], n))
        if fmt.kind == "turbo":
            groups = want.reshape(want.shape[0], -1, fmt.block_size).astype(np.float64)
            norm = np.sqrt((groups ** 2).sum(axis=-1, keepdims=True))
            stages = math.log2(fmt.block_size) + 2
            atol = np.broadcast_to(TURBO_DEQUANT_ULPS * stages * U32 * norm, groups.shape).reshape(want.shape)
            r = assert_values_close(got, want, atol=atol, tolerance_name="TURBO_DEQUANT_ULPS x rotation stages x row norm",
                                    context=f"dequantize {fmt.key}")
            with np.errstate(invalid="ignore", divide="ignore"):
                err = np.abs(to_numpy(got).astype(np.float64) - want)
                ratio = np.where(atol > 0, err / np.where(atol > 0, atol, 1), 0.0)
            return float(np.nanmax(ratio)) if ratio.size else 0.0
        assert_values_close(got, want, context=f"dequantize {fmt.key}")
        return 0.0
    if op == "decode-attention":
        from .strategies_attention import AttentionProblem

        length = case.params["length"]
        p = AttentionProblem(a["q"], a["k_blocks"], a["v_blocks"], case.formats[0], case.formats[1],
                             tuple(length) if isinstance(length, list) else length, case.params.get("scale"),
                             case.params.get("window"), case.params.get("softcap"), a.get("sinks"),
                             start=_tuple(case.params.get("start", 0)))
        kw = p.kwargs()
        got = fn(kw.pop("q"), kw.pop("k_blocks"), kw.pop("v_blocks"), **kw)
        want, bound = p.oracle(chain=claim.chain() if claim.chain else None,
                               q_precision=(claim.q_precision() if claim.q_precision else None) or "exact")
        return assert_attention_close(got, want, bound, context=f"{p!r}")["worst_ratio"]
    raise KernelClaimError(f"unknown op {op!r}")


# ----------------------------------------------------------------------------------- fuzzing


@dataclass
class FuzzResult:
    """What a fuzz run covered and, if it failed, the shrunk counterexample."""

    op: str
    examples: int = 0
    shapes: set = field(default_factory=set)
    formats: set = field(default_factory=set)
    worst_ratio: float = 0.0
    seconds: float = 0.0
    failure: "Case | None" = None
    message: str = ""
    snippet: str = ""

    @property
    def ok(self) -> bool:
        return self.failure is None

    def report(self) -> str:
        head = (f"{self.op}: {self.examples} examples, {len(self.shapes)} shapes, formats "
                f"{', '.join(sorted(self.formats)) or '-'}, worst error/allowed {self.worst_ratio:.3g}, "
                f"{self.seconds:.1f} s")
        if self.ok:
            return head + ": no counterexample"
        return f"{head}\nCOUNTEREXAMPLE {self.failure!r}\n{self.message}\n\n{self.snippet}"


def _fn_ref(fn: Callable) -> "tuple[str, str] | None":
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not mod or mod == "__main__" or "<" in qual or not qual:
        return None
    return mod, qual


def snippet(fn: Callable, case: Case, claim: Claim) -> str:
    """A runnable test that keeps ``case`` forever (``@example``) and the plain call that fails."""
    ref = _fn_ref(fn)
    source = getattr(fn, "__tqbridge_source__", None) or getattr(getattr(fn, "func", None), "__tqbridge_source__", None)
    if source:
        imp = source
    elif ref:
        mod, qual = ref
        head = qual.split(".")[0]
        imp = f"from {mod} import {head}\n" + (f"fn = {qual}\n" if qual != head else f"fn = {head}\n")
    else:
        imp = "fn = ...  # your kernel (it was not importable by name)\n"
    args = [repr(claim.op)]
    if claim.op == "decode-attention":
        if claim.k_formats:
            args.append(f"k_format={list(claim.k_formats)!r}")
        if claim.v_formats:
            args.append(f"v_format={list(claim.v_formats)!r}")
        if claim.starts:
            args.append("starts=True")
    elif claim.formats:
        args.append(f"fmt={list(claim.formats)!r}")
    text = case.to_text()
    wrapped = "\n".join(f"    {text[i:i + 96]!r}" for i in range(0, len(text), 96))
    return (
        f"# {case!r}\n"
        "# Run it: python <this file> (the failing call), or pytest <this file> (the case kept by @example).\n"
        "from hypothesis import example, given\n"
        "from tqbridge.parity import testing as tqt\n"
        f"{imp}\n"
        f"CASE = tqt.Case.from_text(\n{wrapped}\n)\n\n\n"
        "@example(case=CASE)\n"
        f"@given(case=tqt.cases({', '.join(args)}))\n"
        "def test_kernel(case):\n"
        "    tqt.check_case(fn, case)\n\n\n"
        "if __name__ == \"__main__\":\n"
        "    tqt.check_case(fn, CASE)\n"
    )


def fuzz_kernel(fn: Callable, op: "str | None" = None, fmt: Any = None, *, k_format: Any = None, v_format: Any = None,
                max_examples: int = 100, seed: "int | None" = None, database: Any = None,
                derandomize: bool = False, on_example: "Callable[[FuzzResult], None] | None" = None,
                before_each: "Callable[[Case], None] | None" = None,
                chain: "Callable[[], int] | None" = None, strategy_options: "dict | None" = None,
                q_precision: "Callable[[], str] | None" = None) -> FuzzResult:
    """Fuzz ``fn`` against the reference for the claimed op and format(s); never raises for a found bug:
    the :class:`FuzzResult` holds the shrunk counterexample, the failure message and a snippet.

    ``op`` / ``fmt`` / ``k_format`` / ``v_format`` default to the claim recorded by :func:`claims`.
    ``database``: a hypothesis example database (failures replay first next time); ``seed`` or
    ``derandomize`` fix the run. ``on_example(result)`` runs after each passing example,
    ``before_each(case)`` before each call (e.g. to save the case in case the kernel crashes the process).
    """
    recorded = getattr(fn, "__tqbridge_claim__", None)
    if op is None:
        if recorded is None:
            raise KernelClaimError("say which op the kernel implements (op=...) or decorate it with @claims(...)")
        claim = recorded
    else:
        claim = make_claim(op, fmt, k_format=k_format, v_format=v_format)
    if chain is not None or q_precision is not None:   # (attention) what the last call reports of itself
        claim = Claim(claim.op, claim.formats, claim.k_formats, claim.v_formats, chain or claim.chain,
                      q_precision or claim.q_precision, claim.starts)
    if getattr(recorded, "starts", False) and not claim.starts:   # the kernel's own word: it takes start=
        claim = Claim(claim.op, claim.formats, claim.k_formats, claim.v_formats, claim.chain, claim.q_precision, True)
    extra = {"starts": True} if claim.starts else {}
    strat = cases(claim.op, None if claim.op == "decode-attention" else claim.formats,
                  k_format=claim.k_formats, v_format=claim.v_formats, **extra, **(strategy_options or {}))
    result = FuzzResult(claim.op)
    last: dict = {}
    t0 = time.monotonic()

    def body(case: Case) -> None:
        result.examples += 1
        result.shapes.add(case.shape)
        result.formats.update(case.formats)
        if before_each is not None:
            before_each(case)
        try:
            ratio = check_case(fn, case, claim)
        except BaseException as e:
            last["case"], last["error"] = case, e
            raise
        result.worst_ratio = max(result.worst_ratio, ratio)
        target(ratio, label="error / allowed")
        if on_example is not None:
            result.seconds = time.monotonic() - t0
            on_example(result)

    test = given(case=strat)(body)
    if seed is not None:
        # @seed alone switches the database off; settings applied after it switch it back on, so a
        # seeded campaign still saves its failures and replays them first.
        test = hyp_seed(seed)(test)
    test = settings(max_examples=max_examples, deadline=None, database=database, derandomize=derandomize,
                    report_multiple_bugs=False, print_blob=False,
                    suppress_health_check=list(HealthCheck))(test)
    try:
        test()
    except BaseException as e:  # noqa: BLE001 - any failure of the kernel is the finding
        if isinstance(e, KeyboardInterrupt) or "case" not in last:
            raise
        result.failure = last["case"]
        err = last["error"]
        result.message = f"{type(err).__name__}: {err}"
        result.snippet = snippet(fn, result.failure, claim)
    result.seconds = time.monotonic() - t0
    return result
