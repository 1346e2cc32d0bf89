"""Where kernel int8-mma's pass-1 time goes: the device time with parts of the key loop switched off.

Runs ``kernel_device_time.py`` (same arguments) on pass-1 sources edited by text substitution, so
that a part of the loop still compiles but is skipped at run time (a condition on ``softcap`` the
compiler cannot fold; the benchmark's softcap is 0):

    nov    every V path (decode + V product): the weights still go through the softmax
    nok    the K products and their scaling (scores 0)
    nokld  the K codes' loads from threadgroup memory (the products run on register values)
    nokv   nok + nov: the copies, the softmax and the merge only
    v23nonorm / v23nosign / v23noidx   inside the turbo2 / turbo3 V decode: no norms (loads and
           products), no sign bytes (turbo3's third index bit), no index loads at all

    python benchmarks/scripts/ablate_pass1.py --ablate none,nov,nok,nokld,nokv --kernels int8-mma --cold --chain \
        --context 4096,32768,131072 [--json out.json]

The outputs of an ablated kernel are wrong by construction; only its time means something: the
full kernel's time minus an ablation's is what that part costs where it cannot hide under the copies.
A substitution that no longer matches the source stops the run (the kernel changed: update it here).
Needs CuPy and a CUDA GPU, as kernel_device_time.py.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kernel_device_time as kdt  # noqa: E402

SKIP = "softcap < -1.0f"   # false at run time (softcap >= 0), unknown to the compiler
SUBS = {
    "none": [],
    "nov": [("            if (V23) {\n                uint npair[2][2];",
             "            if (!(" + SKIP + ")) {} else if (V23) {\n                uint npair[2][2];")],
    "nok": [("            TQ_UNROLL\n            for (int k = 0; k < NB; ++k) {\n                uint a0, a1, a2, a3;",
             "            for (int k = 0; k < (" + SKIP + " ? NB : 0); ++k) {\n                uint a0, a1, a2, a3;")],
    # (both read paths: whole words, tqa_q8_pair, and half words; the blocks' d still loaded)
    "nokld": [("                if (Q8W) {   // 32-bit loads only (tqa_q8_pair; the even blocks' slots rotated by 2, q's too)\n"
               "                    tqa_q8_pair(r0 + (k & ~1) * kbb, k & 1, (int)t4, &a0, &a2, &d0);\n"
               "                    tqa_q8_pair(r1 + (k & ~1) * kbb, k & 1, (int)t4, &a1, &a3, &d1);\n"
               "                } else {\n"
               "                    tqa_codes8(kf, r0 + k * kbb, (int)t4, ktab, &a0, &a2, ((k * kbb + 2) & 3) == 0 && (KRB & 3) == 0);\n"
               "                    tqa_codes8(kf, r1 + k * kbb, (int)t4, ktab, &a1, &a3, ((k * kbb + 2) & 3) == 0 && (KRB & 3) == 0);\n"
               "                    d0 = tqa_half(r0 + k * kbb, 0);\n"
               "                    d1 = tqa_half(r1 + k * kbb, 0);\n"
               "                }",
               "                a0 = lane * 0x01010101u + k; a1 = a0 ^ 0x5a5a5a5au; a2 = a0 + 7u; a3 = a1 + 3u;\n"
               "                d0 = tqa_half(r0 + k * kbb, 0);\n"
               "                d1 = tqa_half(r1 + k * kbb, 0);")],
}
SUBS["nokv"] = SUBS["nok"] + SUBS["nov"]
# inside the turbo2 / turbo3 permute decode (V23)
SUBS["v23nonorm"] = [   # the keys' norms: neither loaded nor multiplied in (an upper bound on folding them into P)
    ("                        npair[pr][run] = tqa_key_pair_u16(vts, VRB, kk[2 * pr], kk[2 * pr + 1], kv[2 * pr],\n"
     "                                                          kv[2 * pr + 1], blk * vbb);",
     "                        npair[pr][run] = 0x3c003c00u;"),
    ("                                a[0][pr][run] = tq_hmul2(tq_byte_perm(lo, hi, 0x6240u), npair[pr][run]);\n"
     "                                a[1][pr][run] = tq_hmul2(tq_byte_perm(lo, hi, 0x7351u), npair[pr][run]);",
     "                                a[0][pr][run] = tq_byte_perm(lo, hi, 0x6240u);\n"
     "                                a[1][pr][run] = tq_byte_perm(lo, hi, 0x7351u);")]
SUBS["v23nosign"] = [   # turbo3's sign bytes and their table: not read
    ("                            if (TQA_VB == 3) w[x][run] |= ptab[bp[vsg + e8]];", "")]
SUBS["v23noidx"] = SUBS["v23nosign"] + [   # the indices from registers, not threadgroup memory
    ("                            const uint qx = tqa_u16(bp, vqs + 2 * e8);",
     "                            const uint qx = (uint)(kk[x] * 0x9e37 + e8) & 0xffffu;")]
PLAIN_SOURCE = kdt.cuda_unit   # the unedited builder (each ablation starts from it)


def ablated_source(names: "list[str]"):
    """kernel_device_time's source builder with the substitutions of ``names`` applied to pass 1."""
    def source(kdef, static: dict) -> str:
        text = PLAIN_SOURCE(kdef, static)
        if "TQA_NS" not in static:   # not an int8-mma pass 1 (the combine pass): as it is
            return text
        for name in names:
            for old, new in SUBS[name]:
                if old not in text:
                    raise SystemExit(f"ablate_pass1: substitution {name!r} no longer matches the kernel source")
                text = text.replace(old, new, 1)
        return text
    return source


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = ["none"]
    if "--ablate" in argv:
        i = argv.index("--ablate")
        names = argv[i + 1].split(",")
        del argv[i:i + 2]
    unknown = [n for n in names if n not in SUBS]
    if unknown:
        print(f"ablate_pass1: unknown ablation(s) {unknown}; known: {sorted(SUBS)}", file=sys.stderr)
        return 2
    out_json = None
    if "--json" in argv:
        i = argv.index("--json")
        out_json = argv[i + 1]
        del argv[i:i + 2]
    command = "python benchmarks/scripts/ablate_pass1.py " + " ".join(["--ablate", ",".join(names)] + argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        for name in names:
            print(f"ablation {name}", flush=True)
            kdt.cuda_unit = ablated_source([name])
            tmp = Path(tmpdir) / f"{name}.json"
            rc = kdt.main(argv + ["--json", str(tmp)])
            if rc:
                return rc
            rows += [dict(r, ablation=name) for r in json.loads(tmp.read_text())["rows"]]
    if out_json:
        Path(out_json).write_text(json.dumps({"what": "kernel int8-mma pass 1 with parts of the key loop skipped",
                                              "command": command, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
