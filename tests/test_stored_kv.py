"""What a llama.cpp build stores per layer against what was asked (tqbridge.bridge.llama.stored_kv).

The TurboQuant fork at 69d8e4b changes cache types by itself (auto-asymmetric K for turbo K = V and
n_head / n_head_kv >= 6; layer-adaptive V types, mode 7 switched on by itself for a turbo2 V on 8+
layers); the pr197 tree has neither rule. CI checks the reading against the forks' own state blobs
(tests/data/fork/stored-kv-<variant>.npz, made by ``python -m tqbridge.parity.harness.stored_kv_goldens``;
provenance inside and in tests/data/fork/PROVENANCE.md); the live tests run ``tqbridge parity`` against
builds named in ``TQBRIDGE_FORK_BUILDS`` (skipped with the reason elsewhere).

Planted bugs caught here: the reader giving the requested types instead of the stored ones (the goldens'
test), a level's report naming the requested pair instead of the stored one (the live test), the rules'
threshold off by one (the rule tests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tqbridge.bridge import get_format
from tqbridge.bridge.llama import side as llama_side
from tqbridge.bridge.blocks.registry import display_name
from tqbridge.bridge.llama.stored_kv import (FORK_RULES_OFF, explain, fork_rules_off, layered_spelling, predict,
                                       stored_pairs, switch_off_fork_rules)

DATA = Path(__file__).parent / "data" / "fork"
VARIANTS = ("fork-69d8e4b", "fork-pr197")
T3, T2, T4 = "turbo3@fork-69d8e4b", "turbo2@fork-69d8e4b", "turbo4@fork-69d8e4b"
V69 = "fork-69d8e4b"


def _as_build(monkeypatch, variant: str) -> None:
    """This process reads ggml type ids as a build of ``variant`` would give them (no library loaded)."""
    monkeypatch.setattr(llama_side, "_selected", llama_side.BuildInfo(Path("golden"), {"turbo": {"variant": variant}}))


def _qualified(request: str, variant: str) -> "tuple[str, str]":
    from tqbridge.parity.harness.run_levels import qualify_turbo
    from tqbridge.bridge.blocks.kv_spec import split_kv

    return split_kv(qualify_turbo(request, variant))


# ------------------------------------------------------------------------------ the rules, as read


def test_auto_asymmetric_k_at_ratio_six_and_not_below():
    pairs = predict(T3, T3, n_head=12, n_head_kv=2, n_layer=4, variant=V69, environ={})
    assert pairs == [("q8_0", T3)] * 4
    assert predict(T3, T3, n_head=10, n_head_kv=2, n_layer=4, variant=V69, environ={}) == [(T3, T3)] * 4
    assert predict(T3, T3, n_head=16, n_head_kv=2, n_layer=4, variant=V69, environ={}) == [("q8_0", T3)] * 4
    # K and V of different types, K not turbo, the switch off, the other variant: no change
    assert predict("q8_0", T3, n_head=12, n_head_kv=2, n_layer=4, variant=V69, environ={}) == [("q8_0", T3)] * 4
    assert predict(T3, T4, n_head=12, n_head_kv=2, n_layer=4, variant=V69, environ={}) == [(T3, T4)] * 4
    assert predict(T3, T3, n_head=12, n_head_kv=2, n_layer=4, variant=V69,
                   environ={"TURBO_AUTO_ASYMMETRIC": "0"}) == [(T3, T3)] * 4
    assert predict("turbo3@fork-pr197", "turbo3@fork-pr197", n_head=12, n_head_kv=2, n_layer=4,
                   variant="fork-pr197", environ={}) == [("turbo3", "turbo3")] * 4


def test_layer_adaptive_modes():
    edge2 = [0, 1, 8, 9]
    got = predict("q8_0", T2, n_head=4, n_head_kv=2, n_layer=10, variant=V69, environ={})   # mode 7 by itself
    assert got == [("q8_0", "q8_0" if i in edge2 else T2) for i in range(10)]
    assert predict("q8_0", T2, n_head=4, n_head_kv=2, n_layer=7, variant=V69, environ={}) == [("q8_0", T2)] * 7
    assert predict("q8_0", T2, n_head=4, n_head_kv=2, n_layer=10, variant=V69,
                   environ={"TURBO_LAYER_ADAPTIVE": "0"}) == [("q8_0", T2)] * 10
    # a turbo3 V gets mode 7 only when the process's first cache had a turbo2 V
    assert predict("q8_0", T3, n_head=4, n_head_kv=2, n_layer=10, variant=V69, environ={}) == [("q8_0", T3)] * 10
    got = predict("q8_0", T3, n_head=4, n_head_kv=2, n_layer=10, variant=V69, environ={}, first_v=T2)
    assert got == [("q8_0", "q8_0" if i in edge2 else T2) for i in range(10)]
    m = lambda mode, k, v: predict(k, v, n_head=4, n_head_kv=2, n_layer=10, variant=V69,  # noqa: E731
                                   environ={"TURBO_LAYER_ADAPTIVE": str(mode)})
    assert m(1, T3, T3) == [("q8_0", "q8_0") if i in (0, 1, 2, 3, 6, 7, 8, 9) else (T3, T3) for i in range(10)]
    assert m(2, T3, T3) == [("q8_0", "q8_0") if i >= 2 else (T3, T3) for i in range(10)]
    assert m(5, "q8_0", T3) == [("q8_0", T4 if i in edge2 else T2) for i in range(10)]
    assert m(6, "q8_0", T3) == [("q8_0", T4 if i >= 2 else T2) for i in range(10)]
    assert m(1, "q8_0", T3) == [("q8_0", T3)] * 10          # modes 1 and 2 need a turbo K


def test_explain_names_each_rule_and_a_change_no_rule_makes():
    both = predict(T2, T2, n_head=12, n_head_kv=2, n_layer=8, variant=V69, environ={})
    rules = explain(T2, T2, both, n_head=12, n_head_kv=2, variant=V69, environ={})
    assert len(rules) == 2 and rules[0].startswith("TURBO_AUTO_ASYMMETRIC: 12/2")
    assert rules[1].startswith("TURBO_LAYER_ADAPTIVE mode 7 (switched on by itself for a turbo2 V cache)")
    assert explain("q8_0", T3, [("q8_0", T3)] * 8, n_head=12, n_head_kv=2, variant=V69, environ={}) == []
    odd = [("q8_0", T3)] * 7 + [("f16", T3)]
    assert explain("q8_0", T3, odd, n_head=12, n_head_kv=2, variant=V69, environ={}) == [
        "no rule of the fork accounts for it: stored q8_0/turbo3@fork-69d8e4b[7=f16/turbo3@fork-69d8e4b]"]


def test_layered_spelling_reads_back_as_the_same_pairs():
    from tqbridge.bridge.blocks.kv_spec import parse_layered_kv_spec

    for pairs in ([("q8_0", T3)] * 5, predict("q8_0", T2, n_head=4, n_head_kv=2, n_layer=12, variant=V69, environ={}),
                  [("q8_0", "q8_0"), (T3, T3), ("q8_0", "q8_0"), ("f16", "f16")]):
        spelling = layered_spelling(pairs)
        assert [p[:2] for p in parse_layered_kv_spec(spelling).pairs(len(pairs))] == pairs, spelling
    assert layered_spelling([(T3, T3)] * 3) == T3 and layered_spelling([("q8_0", T3)] * 3) == f"q8_0/{T3}"


def test_switching_the_rules_off_sets_both_variables():
    env = {"TURBO_LAYER_ADAPTIVE": "7"}
    assert not fork_rules_off(env)
    before = switch_off_fork_rules(env)
    assert env == FORK_RULES_OFF and fork_rules_off(env) and before == {"TURBO_AUTO_ASYMMETRIC": None,
                                                                           "TURBO_LAYER_ADAPTIVE": "7"}


def test_the_shims_log_splits_into_lines_with_their_levels():
    from tqbridge.bridge.llama.shim import split_log

    raw = (b"\x1e2load: first\nload: second\n\x1e3llama_kv_cache: auto-asymmetric: K\x1e5 to q8_0\n"
           b"\x1e4bad thing\n\x1e2.\x1e5.\x1e5\n")
    assert split_log(raw) == [("info", "load: first"), ("info", "load: second"),
                              ("warn", "llama_kv_cache: auto-asymmetric: K to q8_0"), ("error", "bad thing"),
                              ("info", "..")]


# ------------------------------------------------------------------------------ the forks' own blobs


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_forks_blobs_store_what_its_rules_say(monkeypatch, variant):
    from tqbridge.bridge.llama.state import parse_state
    from tqbridge.bridge.llama.stored_kv import read_stored

    z = np.load(DATA / f"stored-kv-{variant}.npz")
    prov = json.loads(str(z["PROVENANCE"]))
    assert prov["variant"] == variant and prov["scenarios"]
    _as_build(monkeypatch, variant)
    changed = set()
    for name in prov["scenarios"]:
        meta = json.loads(str(z[f"{name}/meta"]))
        k, v = _qualified(meta["request"], variant)
        state = parse_state(z[f"{name}/blob"].tobytes())
        pairs = stored_pairs(state)
        want = predict(k, v, n_head=meta["n_head"], n_head_kv=meta["n_head_kv"], n_layer=meta["n_layer"],
                       variant=variant, environ=meta["switches"])
        assert pairs == want, name
        rules = explain(k, v, pairs, n_head=meta["n_head"], n_head_kv=meta["n_head_kv"], variant=variant,
                        environ=meta["switches"])
        asked = predict(k, v, n_head=1, n_head_kv=1, n_layer=meta["n_layer"], variant=variant,
                        environ=FORK_RULES_OFF)           # the request in every layer, as names
        # the fork says so in its log exactly when it changed a type, and we name a rule exactly then
        assert bool(meta["log"]) == bool(rules) == (pairs != asked), name
        if rules:
            changed.add(name)
            got = read_stored(state, f"{k}/{v}", heads=(meta["n_head"], meta["n_head_kv"]), variant=variant)
            assert got.spelling == layered_spelling(pairs) and got.spelling != f"{k}/{v}" and got.changed
    if variant == V69:
        assert changed == {"auto-asymmetric", "auto-asymmetric-16-2", "layer-adaptive", "both-rules"}
    else:
        assert changed == set()


# ------------------------------------------------------------------------------ the levels name stored types


def test_teacher_reads_each_layers_formats_from_what_flash_attention_read():
    from types import SimpleNamespace

    from tqbridge.bridge import get_format
    from tqbridge.parity.harness.level_teacher import layer_formats

    table = {f.key: i for i, f in llama_side.type_table(V69).items()}
    L = SimpleNamespace(k_type=table["q8_0"], v_type=table[T3])
    asked = SimpleNamespace(k=T3, v=T3)
    old = llama_side._selected
    try:
        llama_side._selected = llama_side.BuildInfo(Path("golden"), {"turbo": {"variant": V69}})
        assert [f.key for f in layer_formats(L, asked)] == ["q8_0", T3]
    finally:
        llama_side._selected = old
    assert layer_formats(SimpleNamespace(k_type=-1, v_type=-1), asked) == (get_format(T3), get_format(T3))


# ------------------------------------------------------------------------------ live, against fork builds


def _fork_builds() -> "list[Path]":
    raw = os.environ.get("TQBRIDGE_FORK_BUILDS", "")
    return [Path(p) for p in raw.split(os.pathsep) if p]


live = pytest.mark.skipif(not _fork_builds(), reason="no TurboQuant fork build: set TQBRIDGE_FORK_BUILDS to "
                          "build directories (tqbridge llama build SRC makes one)")


def _parity(tmp_path, build, gguf, kvs, levels, *extra) -> "tuple[int, dict, str, str]":
    out = tmp_path / "p.json"
    cmd = [sys.executable, "-m", "tqbridge.tools.cli", "parity", str(gguf), "--llama", str(build), "--levels",
           levels, "--tokens", "32", "--quiet", "--json", str(out), *extra]
    for kv in kvs:
        cmd += ["--kv", kv]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
    return r.returncode, json.loads(out.read_text()), r.stdout, r.stderr


def _named(report: dict) -> "dict[str, set]":
    """Per level: the (requested, named) pairs its report gives for each K/V pair."""
    out = {}
    out["logits"] = {(r["requested"], r["kv"]) for r in report.get("logits", []) if r["requested"] != "f16"}
    for level in ("cache", "teacher"):
        out[level] = {(e["requested"], e["kv"]) for e in report.get(level, {}).get("kv", [])}
    t = report.get("transplant", {}).get("turbo")
    out["transplant"] = {(t["requested"], t["kv"])} if t else set()
    return out


@live
@pytest.mark.parametrize("fork_rules", ["honour", "off"])
def test_live_auto_asymmetric_12_2(tmp_path, fork_rules):
    from tqbridge.bridge.llama import build as llama_build
    from tqbridge.parity.harness.stored_kv_goldens import write_geometry

    gguf = write_geometry(tmp_path / "llama-12-2.gguf", "12-2")
    for build in _fork_builds():
        variant = llama_build.describe(build).variant
        rc, rep, out, err = _parity(tmp_path, build, gguf, ["q8_0/turbo3", "turbo3/turbo3"],
                                    "logits,cache,teacher,transplant", "--fork-rules", fork_rules)
        assert rc == 0, out[-3000:]
        t3 = f"turbo3@{variant}"
        name = display_name(get_format(t3))    # as reports write it (pr197's turbo types without the variant)
        stored = f"q8_0/{name}" if variant == V69 and fork_rules == "honour" else name
        for level, named in _named(rep).items():
            if level != "transplant":   # the transplant level takes the first turbo pair only
                assert (t3, stored) in named, (level, named)
        changed = variant == V69 and fork_rules == "honour"
        assert ("auto-asymmetric" in err) == changed
        assert any("auto-asymmetric" in e["text"] for e in rep["llama_log"]) == changed
        assert rep["stored_types"][t3]["stored"] == stored


@live
@pytest.mark.parametrize("fork_rules", ["honour", "off"])
def test_live_layer_adaptive_16_2(tmp_path, fork_rules):
    from tqbridge.bridge.llama import build as llama_build
    from tqbridge.parity.harness.stored_kv_goldens import write_geometry

    gguf = write_geometry(tmp_path / "llama-16-2.gguf", "16-2")
    for build in _fork_builds():
        variant = llama_build.describe(build).variant
        rc, rep, out, err = _parity(tmp_path, build, gguf, ["q8_0/turbo2"], "cache,teacher",
                                    "--fork-rules", fork_rules)
        assert rc == 0, out[-3000:]
        t2 = f"turbo2@{variant}"
        name = display_name(get_format(t2))
        changed = variant == V69 and fork_rules == "honour"
        stored = f"q8_0/q8_0[2-5=q8_0/{name}]" if changed else f"q8_0/{name}"
        for level in ("cache", "teacher"):
            assert _named(rep)[level] == {(f"q8_0/{t2}", stored)}, level
        layers = rep["teacher"]["kv"][0]["layers"]
        assert [L["v"] for L in layers] == [("q8_0" if changed and i in (0, 1, 6, 7) else name) for i in range(8)]
        assert ("Boundary V" in err) == changed
