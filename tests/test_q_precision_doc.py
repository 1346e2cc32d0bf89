"""docs/q-precision.md's table against the record it cites (benchmarks/records/cpu/2026-12-01-q-precision-kl.json)."""

from __future__ import annotations

from pathlib import Path

from test_doc_claims import rounds_to, table

from tqbridge.tools.records import results

ROOT = Path(__file__).resolve().parents[1]
RECORD = "benchmarks/records/cpu/2026-12-01-q-precision-kl.json"


def test_q_precision_table_is_its_record():
    doc = (ROOT / "docs/q-precision.md").read_text()
    assert RECORD in doc
    rec = results(ROOT / RECORD)
    paired = {(m, r["kv"]): r for m, rows in rec["paired"].items() for r in rows}
    rows = table(doc, "| model | K / V | KL vs f16, exact q")
    assert [(r[0], r[1]) for r in rows] == [(t["model"], t["kv"]) for t in rec["table"]]
    bad = []
    for row, t in zip(rows, rec["table"]):
        _, _, exact, int8, rel, kl_ei, top1, agree = row
        p = paired[(t["model"], t["kv"])]
        # the paired run reads the same tokens through the same code: it must give the CLI's numbers
        assert p["kl_exact"] == t["kl_exact"] and p["kl_int8"] == t["kl_int8"], t["kv"]
        for cell, v, scale in ((exact, t["kl_exact"], 1), (int8, t["kl_int8"], 1), (rel, t["relative"], 100),
                               (kl_ei, p["kl_exact_int8"], 1), (top1.split("/")[0], t["top1_exact"], 100),
                               (top1.split("/")[1], t["top1_int8"], 100), (agree, p["top1_exact_int8"], 100)):
            if not rounds_to(cell, v, scale):
                bad.append(f"{t['model']} {t['kv']}: {cell} vs {v * scale}")
        # every decode step of the int8 run took the int8 path, of the exact run the exact one
        assert all(k.endswith(" q=int8") for k in t["decode_int8"]), t["decode_int8"]
        assert all(k.endswith(" q=exact") for k in t["decode_exact"]), t["decode_exact"]
    assert not bad, bad


def test_q_precision_control_table_and_sentences_are_the_record():
    doc = (ROOT / "docs/q-precision.md").read_text()
    rec = results(ROOT / RECORD)
    control = {(m, r["kv"]): r for m, rows in rec["control"].items() for r in rows}
    rows = table(doc, "| model | K / V | KL vs f16, exact q | KL vs f16, int8 q | KL(exact")
    assert [(r[0], r[1]) for r in rows] == list(control)
    bad = []
    for model, kv, exact, int8, kl_ei, agree in rows:
        c = control[(model, kv)]
        assert all(k.startswith("decode:") for k in c["paths"]["int8"] if k != "append")
        assert c["q_precision"] == {"exact": ["exact"], "int8": ["int8"]}
        for cell, v, scale in ((exact, c["kl_exact"], 1), (int8, c["kl_int8"], 1), (kl_ei, c["kl_exact_int8"], 1),
                               (agree, c["top1_exact_int8"], 100)):
            if not rounds_to(cell, v, scale):
                bad.append(f"{model} {kv}: {cell} vs {v * scale}")
    assert not bad, bad
    # the headline: int8 q's own KL (f16 control) and the q8_0/q8_0 increase
    own = sorted(control[(m, "f16/f16")]["kl_exact_int8"] for m in rec["control"])
    assert f"{own[0]:.1e}".replace("e-04", "e-4") in doc and f"{own[1]:.1e}".replace("e-04", "e-4") in doc
    for m in rec["control"]:
        c = control[(m, "q8_0/q8_0")]
        assert f"+{round(100 * (c['kl_int8'] / c['kl_exact'] - 1))}%" in doc
    demo = results(ROOT / "benchmarks/records/cpu/2026-12-01-demo.json")
    q8 = [x for x in demo["logits"] if x.get("kv") == "q8_0" or x.get("k_format") == "q8_0"]
    assert q8 and f"{q8[0]['baseline']['llama_kl_mean']:.6f}" in doc
