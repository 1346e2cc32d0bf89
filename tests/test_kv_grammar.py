"""One K/V grammar (bridge/blocks/kv_spec.py): every former entry point answers as the grammar does on one
table of spellings (bad ones with their one-line errors), '@' is never read as the q precision, and no
other module splits a K/V spelling itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytest.importorskip("mlx_lm")

from tqbridge.bridge import FormatError  # noqa: E402
from tqbridge.bridge.blocks import kv_spec as g  # noqa: E402
from tqbridge.bridge.blocks.registry import all_formats  # noqa: E402
from tqbridge.bridge.llama.stored_kv import layered_spelling  # noqa: E402
from tqbridge.metal import lm, profiling  # noqa: E402
from tqbridge.metal.attention.problem import Q_PRECISIONS  # noqa: E402
from tqbridge.metal.decode_options import DecodeOptions  # noqa: E402
from tqbridge.metal.lm import calibration  # noqa: E402
from tqbridge.parity.harness.runtimes import KV  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

SPELLINGS = [  # good and bad, every part of the grammar
    "q8_0", "q8_0/turbo3", " Q8_0 / TURBO3 ", "turbo3@g64/q4_0", "turbo4@fork-69d8e4b", "q5_1+mean+scale/q4_0",
    "q5_1+qscale=0.75+rotated/q4_0", "q8_0/turbo3[0,1,-2,-1=q8_0/q8_0]", "q8_0/turbo3[0-3=q8_0/q8_0][-1=f16]",
    "q8_0/turbo3[-1=q5_1+mean/q4_0]",
    "", "/", "q8_0/", "q8_0//q4_0", "q9_9/turbo3", "turbo3@nope", "turbo3@", "q8_0/q4_0+mean", "q5_1+/q4_0",
    "q5_1+bogus/q4_0", "q8_0/turbo3@int8", "q8_0@exact", "q8_0/turbo3[0=f16", "q8_0/turbo3]", "[0=f16]",
    "q8_0/turbo3[x=f16]", "q8_0/turbo3[0,0=f16]", "q8_0/turbo3[-1=f16]@int8", "x" * 200,
]


def outcome(fn, *args):
    """``("ok", value)`` or ``("error", type name, message)``; an error message must be one line."""
    try:
        return ("ok", fn(*args))
    except (ValueError, TypeError) as e:   # FormatError, CalibrationError, SettingsError are ValueErrors
        msg = str(e)
        assert msg and "\n" not in msg and "Traceback" not in msg, msg
        return ("error", msg)


def test_former_names_are_the_grammars():
    """tqbridge.metal.lm's spelling names and calibration's KeyCalibration are the grammar's own objects."""
    for name in ("parse_kv", "parse_kv_spec", "kv_name", "LayeredKV", "parse_layered_kv_spec", "layered_kv_name"):
        assert getattr(lm, name) is getattr(g, name)
    for name in ("KeyCalibration", "CalibrationError", "BASES", "DEFAULT_ALPHA"):
        assert getattr(calibration, name) is getattr(g, name)
        assert getattr(lm, name, getattr(g, name)) is getattr(g, name)


@pytest.mark.parametrize("spec", SPELLINGS, ids=[s[:24] or "empty" for s in SPELLINGS])
def test_every_reader_answers_as_the_grammar(spec):
    layered = outcome(g.parse_layered_kv_spec, spec)
    if layered[0] == "ok":
        kv = layered[1]
        assert g.parse_layered_kv_spec(g.layered_kv_name(kv)) == kv     # parse(write(x)) == x
        if not kv.groups:
            assert outcome(g.parse_kv_spec, spec) == ("ok", kv.default)
    # bench labels: the spelling before the braces, the options DecodeOptions.parse reads
    for label in (spec, g.label_name(spec, "compile=0,q_precision=int8")):
        want = outcome(g.split_label, label)
        got = outcome(profiling.split_options, label)
        if want[0] == "ok":
            assert got == ("ok", (want[1][0], DecodeOptions.parse(want[1][1])))
            assert g.label_name(*want[1]) == label
        else:
            assert got == want
    # parity's pair: the grammar's split, names as written (lower case); per-layer spellings refused
    kv = outcome(KV.parse, spec)
    if g.is_layered(spec):
        assert kv[0] == "error" and "per-layer" in kv[1]
    else:
        split = outcome(g.split_kv, spec)
        assert (kv[0], kv[0] == "ok" and (kv[1].k, kv[1].v)) == (split[0], split[0] == "ok" and
                                                                    tuple(x.lower() for x in split[1]))
        if kv[0] == "ok":
            assert KV.parse(kv[1].name) == kv[1]


def test_bad_spellings_name_the_bad_part():
    cases = {
        "q9_9/turbo3": "unknown format 'q9_9'",
        "turbo3@nope": "unknown variant 'nope' of turbo3",
        "turbo3@": "'turbo3@': nothing after '@'",
        "q5_1+bogus/q4_0": "unknown key calibration 'bogus'",
        "q8_0/q4_0+mean": "calibration applies to keys only",
        "q8_0/turbo3[x=f16]": "bad layer 'x'",
        "q8_0/turbo3[0,0=f16]": "layer 0 is written twice",
        "q8_0/turbo3@int8": "'turbo3@int8': '@' names a format variant",
    }
    for spec, words in cases.items():
        kind, msg = outcome(g.parse_layered_kv_spec, spec)
        assert kind == "error" and words in msg, (spec, msg)


def test_at_is_a_format_variant_never_the_q_precision():
    assert g._FORMER_Q_SUFFIX.pattern.count("|") + 1 == len(Q_PRECISIONS)
    assert all(g._FORMER_Q_SUFFIX.search(f"q8_0@{q}") for q in Q_PRECISIONS)
    # every variant the registry knows, written after '@': a format, and the label's options stay the defaults
    for f in all_formats():
        if not f.variant:
            continue
        spelling = f"q8_0/{f.name}@{f.variant}"
        base, opts = profiling.split_options(spelling)
        assert base == spelling and opts == DecodeOptions() and opts.q_precision is None
        assert g.parse_kv(spelling)[1] in (f.key, f.name)
    # the q precision goes in the braces; after '@' it is an error naming that spelling, on every reader
    assert profiling.split_options("q8_0/turbo3{q_precision=int8}")[1].q_precision == "int8"
    for q in Q_PRECISIONS:
        for spelling in (f"q8_0/turbo3@{q}", f"q8_0/turbo3[-1=f16]@{q}", f"q8_0/turbo3@{q}{{compile=0}}"):
            readers = (profiling.split_options, g.split_label) + (() if "{" in spelling else (g.parse_layered_kv_spec,))
            for reader in readers:
                kind, msg = outcome(reader, spelling)
                assert kind == "error" and g.Q_PRECISION_EXAMPLE in msg, (reader, spelling, msg)


def test_writers_parse_back():
    assert g.kv_name("q8_0", "q8_0", short=True) == "q8_0" and g.kv_name("q8_0", "q8_0") == "q8_0/q8_0"
    cal = g.KeyCalibration(mean=True, scale=True, alpha=0.75, basis="rotated")
    assert g.parse_kv_spec(g.kv_name("q5_1", "q4_0", cal)) == ("q5_1", "q4_0", cal)
    pairs = [("q8_0", "q8_0"), ("q8_0", "turbo3"), ("q8_0", "turbo3"), ("f16", "f16"), ("q8_0", "turbo3")]
    kv = g.parse_layered_kv_spec(layered_spelling(pairs))
    assert [p[:2] for p in kv.pairs(len(pairs))] == pairs
    assert g.qualify_variant("turbo3", "fork-pr197") == "turbo3@fork-pr197"
    assert g.qualify_variant("turbo3@g64", "fork-pr197") == "turbo3@g64" and g.qualify_variant("q8_0", "x") == "q8_0"
    assert g.split_top("fp16, q8_0/turbo3[0,-1=q8_0/q8_0]{compile=0,chunks=1},,q8_0") == [
        "fp16", "q8_0/turbo3[0,-1=q8_0/q8_0]{compile=0,chunks=1}", "q8_0"]


# ---- no second parser: a module other than the grammar that splits at a spelling's separators

GRAMMAR = "bridge/blocks/kv_spec.py"
SEPARATORS = ("/", "@", "+", "[", "]", "{", "}")
SPLITTERS = ("split", "rsplit", "partition", "rpartition")
# (file, separator): why that split is not of a K/V spelling
NOT_SPELLINGS = {
    ("bridge/blocks/registry.py", "@"): "the registry's own format key name@variant, which the grammar resolves through",
    ("bridge/llama/compat.py", "+"): "a package version's local part (0.3.16+cu124)",
}


def splits(source: str) -> "list[tuple[int, str]]":
    """``(line, separator)`` of each ``x.split(SEP)`` / ``partition(SEP)`` (and r-forms) with a
    separator of the grammar as a literal."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in SPLITTERS and n.args
                and isinstance(n.args[0], ast.Constant) and n.args[0].value in SEPARATORS):
            out.append((n.lineno, n.args[0].value))
    return out


def test_only_the_grammar_splits_spellings():
    found = []
    for top in ("bridge", "metal", "parity", "tools", "benchmarks"):
        for p in sorted((ROOT / top).rglob("*.py")):
            rel = p.relative_to(ROOT).as_posix()
            if rel == GRAMMAR:
                continue
            found += [f"{rel}:{line} splits at {sep!r}" for line, sep in splits(p.read_text())
                      if (rel, sep) not in NOT_SPELLINGS]
    assert not found, ("K/V spellings are parsed by bridge/blocks/kv_spec.py only (split_kv, split_key_spec, "
                       "parse_layered_kv_spec, split_label, split_top); call it: " + "; ".join(found))
    for (rel, sep) in NOT_SPELLINGS:   # each exception still exists (a stale one would hide a new split)
        assert any(s == sep for _, s in splits((ROOT / rel).read_text())), rel
    assert splits((ROOT / GRAMMAR).read_text()), "the grammar itself must be seen splitting"


def test_the_splitter_check_sees_a_planted_parser():
    planted = 'def read(spec):\n    k, _, v = spec.partition("/")\n    fmt = k.split("@")[0]\n    return fmt, v\n'
    assert sorted(splits(planted)) == [(2, "/"), (3, "@")]
    assert splits('rows = line.split(",")\nname, _, ext = path.rpartition(".")\n') == []
