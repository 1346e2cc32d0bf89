"""K/V spellings: what every reader accepts and the message it gives otherwise (pinned on the code
before the readers shared one splitter, tqbridge.bridge.blocks.kv_spec)."""

from __future__ import annotations

import pytest

pytest.importorskip("mlx_lm")

from tqbridge.bridge import FormatError  # noqa: E402
from tqbridge.bridge.blocks.kv_spec import parse_kv, parse_kv_spec  # noqa: E402
from tqbridge.metal.lm.calibration import KeyCalibration  # noqa: E402
from tqbridge.tools.cli import main  # noqa: E402

NO_CAL = KeyCalibration()
ACCEPTED = [  # spelling, (K, V) from parse_kv (None: parse_kv refuses it), (K, V, calibration) from parse_kv_spec
    ("q8_0", ("q8_0", "q8_0"), ("q8_0", "q8_0", NO_CAL)),
    ("q8_0/turbo3", ("q8_0", "turbo3"), ("q8_0", "turbo3", NO_CAL)),
    (" Q8_0 / TURBO3 ", ("q8_0", "turbo3"), ("q8_0", "turbo3", NO_CAL)),
    ("q8_0/turbo3@g64", ("q8_0", "turbo3@g64"), ("q8_0", "turbo3@g64", NO_CAL)),
    ("turbo3@g64", ("turbo3@g64", "turbo3@g64"), ("turbo3@g64", "turbo3@g64", NO_CAL)),
    ("turbo4@fork-69d8e4b/q4_0", ("turbo4@fork-69d8e4b", "q4_0"), ("turbo4@fork-69d8e4b", "q4_0", NO_CAL)),
    ("f16", ("f16", "f16"), ("f16", "f16", NO_CAL)),
    ("iq4_nl/q8_0", ("iq4_nl", "q8_0"), ("iq4_nl", "q8_0", NO_CAL)),
    ("q5_1+mean+scale/q4_0", None, ("q5_1", "q4_0", KeyCalibration(mean=True, scale=True))),
    ("q5_1+mean/q4_0", None, ("q5_1", "q4_0", KeyCalibration(mean=True))),
]
UNKNOWN = "; known formats: f32, f16, bf16, q8_0"
REFUSED = [  # spelling, parse_kv's message, parse_kv_spec's message (each a prefix)
    ("", "bad K/V format pair '': write K/V, e.g. q8_0/turbo3",
     "bad K/V format pair '': write K/V, e.g. q8_0/turbo3 or q5_1+mean/q4_0"),
    ("/", "bad K/V format pair '/': write K/V, e.g. q8_0/turbo3",
     "bad K/V format pair '/': write K/V, e.g. q8_0/turbo3 or q5_1+mean/q4_0"),
    ("q8_0/", "bad K/V format pair 'q8_0/': write K/V, e.g. q8_0/turbo3",
     "bad K/V format pair 'q8_0/': write K/V, e.g. q8_0/turbo3 or q5_1+mean/q4_0"),
    ("/q8_0", "bad K/V format pair '/q8_0': write K/V", "bad K/V format pair '/q8_0': write K/V"),
    ("q8_0/q4_0/q4_0", "bad K/V format pair 'q8_0/q4_0/q4_0': write K/V, e.g. q8_0/turbo3",
     "bad K/V format pair 'q8_0/q4_0/q4_0': write K/V, e.g. q8_0/turbo3 or q5_1+mean/q4_0"),
    ("q9_9/turbo3", "unknown format 'q9_9'" + UNKNOWN, "unknown format 'q9_9'" + UNKNOWN),
    ("turbo3@nope", "unknown variant 'nope' of turbo3; known variants: fork-69d8e4b, fork-pr197, g64",
     "unknown variant 'nope' of turbo3; known variants: fork-69d8e4b, fork-pr197, g64"),
    ("q8_0/q4_0+mean", "unknown format 'q4_0+mean'" + UNKNOWN,
     "'q8_0/q4_0+mean': calibration applies to keys only (write it after the K format)"),
    ("q5_1+/q4_0", "unknown format 'q5_1+'" + UNKNOWN, "'q5_1+': nothing after '+' (write e.g. q5_1+mean+scale)"),
    ("q5_1+bogus/q4_0", "unknown format 'q5_1+bogus'" + UNKNOWN,
     "unknown key calibration 'bogus' in 'bogus': use mean, scale, qscale"),
    ("x" * 80, "unknown format '" + "x" * 60 + "'... (80 characters)" + UNKNOWN,
     "unknown format '" + "x" * 60 + "'... (80 characters)" + UNKNOWN),
]


@pytest.mark.parametrize("spec, pair, full", ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_accepted_spellings(spec, pair, full):
    assert parse_kv_spec(spec) == full
    if pair is None:
        with pytest.raises(FormatError, match="unknown format"):
            parse_kv(spec)
    else:
        assert parse_kv(spec) == pair


@pytest.mark.parametrize("spec, kv_message, spec_message", REFUSED, ids=[r[0][:20] or "empty" for r in REFUSED])
def test_refused_spellings(spec, kv_message, spec_message):
    with pytest.raises(FormatError) as e:
        parse_kv(spec)
    assert str(e.value).startswith(kv_message)
    with pytest.raises(FormatError) as e:
        parse_kv_spec(spec)
    assert str(e.value).startswith(spec_message)


# `tqbridge bench decode --caches`: K/V spellings with optional decode options in braces, the q precision
# among them ('@' is a format variant, as everywhere). --tokens 1 is refused after the caches are checked,
# so an accepted spelling ends in the --tokens message.
FORMER_Q = ": '@' names a format variant; the q precision is the decode option q_precision, e.g. " \
           "tqbridge bench decode --caches 'q8_0/turbo3{q_precision=int8}'"
BENCH = [
    ("q8_0/turbo3{q_precision=int8}", "--tokens: at least 4"),
    ("q8_0/turbo3{q_precision=exact}", "--tokens: at least 4"),
    ("q5_1+mean/q4_0{q_precision=int8}", "--tokens: at least 4"),
    ("q8_0/turbo3[-1=f16]{q_precision=int8,compile=0}", "--tokens: at least 4"),
    ("fp16,mlx-q8,mlx-q4,q8_0", "--tokens: at least 4"),
    ("q8_0/turbo3@g64", "--tokens: at least 4"),
    ("turbo3@g64{q_precision=int8}", "--tokens: at least 4"),
    ("q8_0/turbo3@int8", "--caches: 'q8_0/turbo3@int8'" + FORMER_Q),
    ("q8_0/turbo3@exact", "--caches: 'q8_0/turbo3@exact'" + FORMER_Q),
    ("q5_1+mean/q4_0@INT8{compile=0}", "--caches: 'q5_1+mean/q4_0@INT8'" + FORMER_Q),
    ("q8_0/turbo3[-1=f16]@int8", "--caches: 'q8_0/turbo3[-1=f16]@int8'" + FORMER_Q),
    ("q8_0/turbo3@", "--caches: 'turbo3@': nothing after '@' (write a format variant, e.g. turbo3@g64)"),
    ("q8_0/turbo3@int8@x", "--caches: unknown variant 'int8@x' of turbo3; known variants: fork-69d8e4b"),
    ("q8_0/turbo3{q_precision=fp8}", "--caches: q_precision must be one of exact, int8"),
    ("fp16{q_precision=int8}", "--caches: 'fp16{q_precision=int8}': decode options apply to TQCache spellings"),
    ("q9_9@int8", "--caches: 'q9_9@int8'" + FORMER_Q),
    ("q8_0//q4_0", "--caches: bad K/V format pair 'q8_0//q4_0': write K/V, e.g. q8_0/turbo3 or q5_1+mean/q4_0"),
]


@pytest.mark.parametrize("caches, message", BENCH, ids=[b[0] for b in BENCH])
def test_bench_decode_caches(caches, message, capsys):
    assert main(["bench", "decode", "--models", "tiny", "--caches", caches, "--tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert f"error: {message}" in err, err
