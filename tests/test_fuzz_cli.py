"""``tqbridge fuzz``: a short campaign on the decode kernel (CPU emulator), a user's module:function,
the planted bugs found and replayed from the example database, and one-line errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tqbridge.metal import backends

EMU = pytest.mark.skipif("cpu-emulator" not in backends(), reason="no C++ compiler for the CPU emulator")


def fuzz(*args, cwd):
    p = subprocess.run([sys.executable, "-m", "tqbridge.tools.cli", "fuzz", *args], cwd=cwd,
                       capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


@EMU
def test_decode_attention_campaign_on_the_emulator(tmp_path):
    rc, out, err = fuzz("decode-attention", "--backend", "cpu-emulator", "--examples", "30", "--jobs", "2",
                        "--db", "db", "--json", "summary.json", cwd=tmp_path)
    assert rc == 0, out + err
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["ok"] and s["backend"] == "cpu-emulator" and s["jobs"] == 2
    assert s["examples"] >= 30 and s["shapes"] >= 5 and len(s["formats"]) >= 5
    assert 0 <= s["worst_error_over_allowed"] <= 1
    assert "no counterexample" in out and f"examples     {s['examples']}" in out
    assert (tmp_path / "db" / "decode-attention").is_dir()


@EMU
def test_kernel_v3_campaign_with_int8_q(tmp_path):
    """--q-precision int8 sends every call through kernel int8-mma where it serves the pair, judged by the
    int8 oracle; the counterexample snippet would rebuild the same target."""
    rc, out, err = fuzz("decode-attention", "--backend", "cpu-emulator", "--q-precision", "int8", "--examples", "12",
                        "--db", "db", "--json", "summary.json", cwd=tmp_path)
    assert rc == 0, out + err
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["ok"] and s["q_precision"] == "int8" and s["examples"] >= 12
    assert "q precision int8" in out
    from tqbridge.parity.plugin.fuzz import our_target

    fn, _ = our_target("decode-attention", "cpu-emulator", "int8")
    assert "our_target('decode-attention', 'cpu-emulator', q_precision='int8')" in fn.__tqbridge_source__


def test_a_timed_campaign_ends_near_its_deadline_even_mid_round(tmp_path):
    """A round of slow examples (a GPU build takes ~20 s) must not carry a campaign far past --minutes:
    measured on the H200, a 2.3-minute campaign was still running at 170 s before this."""
    import time

    (tmp_path / "slow.py").write_text(
        "import time\nimport numpy as np\n"
        "def deq(blocks, n):\n"
        "    time.sleep(2.0)\n"
        "    b = np.asarray(blocks, np.uint8).reshape(-1, 34)\n"
        "    d = b[:, :2].copy().view('<f2').astype(np.float32)\n"
        "    return (d * b[:, 2:].view(np.int8).astype(np.float32)).reshape(-1, n)\n")
    t0 = time.monotonic()
    rc, out, err = fuzz("slow:deq", "--op", "dequantize", "--format", "q8_0", "--minutes", "0.05", "--db", "db",
                        cwd=tmp_path)
    elapsed = time.monotonic() - t0
    assert rc == 0, out + err
    assert elapsed < 3 + 2 * 5.0 + 10, elapsed      # deadline + grace + join + process start; a round is 50 s
    assert not list((tmp_path / "db").rglob("running-*.case"))


def test_planted_gqa_bug_is_found_then_replayed_from_the_database(tmp_path):
    shutil.copy(Path(__file__).resolve().parents[1] / "docs" / "examples" / "fuzz_demo.py", tmp_path)
    target = "fuzz_demo:attention_missing_gqa_index"
    rc, out, err = fuzz(target, "--db", "db", "--json", "first.json", cwd=tmp_path)
    assert rc == 1, out + err
    assert "COUNTEREXAMPLE Case(decode-attention" in out and "@example(case=CASE)" in out
    saved = tmp_path / "db" / "fuzz_demo_attention_missing_gqa_index" / "counterexample.py"
    assert saved.is_file() and "tqt.check_case(fn, CASE)" in saved.read_text()
    first = json.loads((tmp_path / "first.json").read_text())
    rc, out, err = fuzz(target, "--db", "db", "--json", "second.json", cwd=tmp_path)
    second = json.loads((tmp_path / "second.json").read_text())
    assert rc == 1 and second["failure"]["case"] == first["failure"]["case"]
    assert second["examples"] < first["examples"]          # the saved failure runs first


def test_user_function_with_the_claim_on_the_command_line(tmp_path):
    (tmp_path / "mine.py").write_text(
        "import numpy as np\n"
        "def deq(blocks, n):\n"
        "    b = np.asarray(blocks, np.uint8).reshape(-1, 34)\n"
        "    d = b[:, :2].copy().view('<f2').astype(np.float32)\n"
        "    return (d * b[:, 2:].view(np.int8).astype(np.float32)).reshape(-1, n)\n")
    rc, out, err = fuzz("mine:deq", "--op", "dequantize", "--format", "q8_0", "--examples", "20", "--db", "db",
                        cwd=tmp_path)
    assert rc == 0, out + err
    assert "formats      1: q8_0" in out


@pytest.mark.parametrize("args, message", [
    (["attention"], "unknown target 'attention'"),
    (["mine"], "unknown target 'mine'"),
    (["nosuchmodule:f"], "cannot import nosuchmodule"),
    (["json:dumps"], "say what it implements with --op"),
    (["json:dumps", "--op", "decode-attention", "--format", "q8_0"], "format pair"),
    (["decode-attention", "--jobs", "0"], "--jobs must be at least 1"),
    (["append", "--q-precision", "int8"], "--q-precision applies to"),
    (["gguf", "--q-precision", "int8"], "--q-precision does not apply to parser targets"),
])
def test_errors_are_one_line(tmp_path, args, message):
    rc, out, err = fuzz(*args, "--db", "db", cwd=tmp_path)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err


@EMU
def test_timed_campaign_of_the_append_kernel_on_chosen_formats(tmp_path):
    rc, out, err = fuzz("append", "--backend", "cpu-emulator", "--minutes", "0.05", "--format", "turbo3",
                        "--db", "db", "--json", "s.json", cwd=tmp_path)
    assert rc == 0, out + err
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["examples"] >= 1 and s["seconds"] >= 3.0 and s["formats"] == ["turbo3@fork-pr197"]
    rc, out, err = fuzz("decode-attention", "--backend", "cpu-emulator", "--examples", "5", "--k-format", "q8_0",
                        "--v-format", "turbo4@g64,q4_1", "--db", "db", "--json", "a.json", cwd=tmp_path)
    assert rc == 0, out + err
    assert set(json.loads((tmp_path / "a.json").read_text())["formats"]) <= {"q8_0", "turbo4@g64", "q4_1"}


def test_a_kernel_that_crashes_its_process_is_reported_with_the_case(tmp_path):
    (tmp_path / "crashy.py").write_text(
        "import ctypes\n"
        "from tqbridge import bridge\n"
        "def deq(blocks, n):\n"
        "    if blocks.shape[0] >= 2:\n"
        "        ctypes.string_at(0)          # reads address 0: the process dies\n"
        "    return bridge.dequantize('q8_0', blocks, n)\n")
    rc, out, err = fuzz("crashy:deq", "--op", "dequantize", "--format", "q8_0", "--examples", "40", "--db", "db",
                        cwd=tmp_path)
    assert rc == 1, out + err
    assert "the kernel crashed its process (signal 11) on this case" in out
    (path,) = (tmp_path / "db").glob("*/counterexample.py")
    saved = path.read_text()
    assert "from crashy import deq" in saved
    case = saved.split("# ")[1].splitlines()[0]
    assert case.startswith("Case(dequantize, q8_0, blocks=(") and not case.startswith("Case(dequantize, q8_0, blocks=(1,")


def test_workers_that_die_right_after_reporting_lose_no_message(tmp_path):
    # Every worker's kernel kills its process (SIGKILL) on its second call, just after the worker
    # reported its first example. Each worker sends on its own pipe synchronously, so every report is
    # in the pipe before the process dies: 6 workers, 6 examples counted, the campaign ends. With one
    # multiprocessing.Queue shared by the workers (sent by a feeder thread) five such campaigns counted
    # 1-5 (measured), and a worker killed while its feeder held the queue's lock would hang the others.
    (tmp_path / "dies.py").write_text(
        "import os, signal\n"
        "from tqbridge import bridge\n"
        "CALLS = [0]\n"
        "def deq(blocks, n):\n"
        "    CALLS[0] += 1\n"
        "    if CALLS[0] == 2:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return bridge.dequantize('q8_0', blocks, n)\n")
    rc, out, err = fuzz("dies:deq", "--op", "dequantize", "--format", "q8_0", "--examples", "60", "--jobs", "6",
                        "--db", "db", "--json", "s.json", cwd=tmp_path)
    assert rc == 1, out + err
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["examples"] == 6, s
    assert s["failure"]["message"].startswith("the kernel crashed its process (signal 9)")
    assert sorted(s["errors"]) == [f"worker {w} died (signal 9)" for w in range(6) if w != s["failure"]["worker"]]


def test_a_campaign_leaves_no_hypothesis_folder_in_the_working_directory(tmp_path):
    """Without --db the example database goes to $TQBRIDGE_CACHE/fuzz and hypothesis' own files (its
    cache of a local module's constants, here mine.py's) to $TQBRIDGE_CACHE/hypothesis: nothing
    lands in the current directory."""
    import os

    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    (work / "mine.py").write_text(
        "import numpy as np\n"
        "def deq(blocks, n):\n"
        "    b = np.asarray(blocks, np.uint8).reshape(-1, 34)\n"
        "    d = b[:, :2].copy().view('<f2').astype(np.float32)\n"
        "    return (d * b[:, 2:].view(np.int8).astype(np.float32)).reshape(-1, n)\n")
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    env.update(TQBRIDGE_CACHE=str(cache), PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.run([sys.executable, "-m", "tqbridge.tools.cli", "fuzz", "mine:deq", "--op", "dequantize",
                        "--format", "q8_0", "--examples", "20"], cwd=work, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "no counterexample" in p.stdout, p.stdout + p.stderr
    assert sorted(f.name for f in work.iterdir()) == ["mine.py"]
    db = cache / "fuzz" / "mine_deq-dequantize"
    assert db.is_dir() and f"database     {db}" in p.stdout
