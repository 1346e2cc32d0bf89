"""Interrupted or failing writes lose nothing (bridge/atomic.py and every CLI output file).

- The helper: a process SIGKILLed while it streams a large output leaves the previous file intact
  and nothing partial under the final name; an error mid-write leaves no temporary either.
- The CLIs (convert, quality, parity, bench, fuzz, selfcheck): each runs in a subprocess whose
  ``os.replace`` / ``os.rename`` hold back the outputs under test (the new bytes stay in their
  temporaries) and then stall; the test SIGKILLs it there, at the last moment before the output
  would be complete under its name. Every previous file must still be there, unchanged, and no new
  one may have appeared; a CLI that wrote an output in place would have clobbered it (or finished
  without stalling) and fails this test.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tqbridge.bridge.atomic import atomic_output, write_atomic

OLD = b"previous contents: must survive\n"

_STREAM = r"""
import os, sys, time
from pathlib import Path
from tqbridge.bridge.atomic import atomic_output
target, marker = sys.argv[1], sys.argv[2]
with atomic_output(target) as tmp:
    with open(tmp, "wb") as f:
        chunk = b"x" * (1 << 20)
        for i in range(10_000):          # up to 10 GiB: never finishes before the kill
            f.write(chunk)
            f.flush()
            if i == 8:
                Path(marker).touch()     # mid-write: 9 MiB out, more to come
            if i >= 8:
                time.sleep(0.05)
"""


def _wait_for(marker: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while not marker.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the process ended (rc {proc.returncode}) before it reached the point to kill:\n"
                        f"{out[-2000:]}\n{err[-3000:]}")
        if time.monotonic() - t0 > timeout:
            _kill(proc)
            pytest.fail("the process never reached the point to kill")
        time.sleep(0.02)


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)   # its own session: the CLI and any worker it started
    proc.wait(timeout=60)


def _temps(target: Path) -> list[Path]:
    return sorted(target.parent.glob(f".{target.name}.*"))


def test_helper_killed_mid_write_keeps_the_previous_file(tmp_path):
    target, marker = tmp_path / "out.bin", tmp_path / "writing"
    target.write_bytes(OLD)
    proc = subprocess.Popen([sys.executable, "-c", _STREAM, str(target), str(marker)], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(marker, proc)
    (tmp,) = _temps(target)
    assert tmp.stat().st_size >= 9 << 20          # the write is under way, beside the target
    assert target.read_bytes() == OLD
    _kill(proc)
    assert proc.returncode == -signal.SIGKILL
    assert target.read_bytes() == OLD             # nothing partial under the final name
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out.bin", "writing", tmp.name])


def test_helper_error_mid_write_leaves_nothing(tmp_path):
    target = tmp_path / "out.json"
    target.write_bytes(OLD)
    with pytest.raises(OSError):
        with atomic_output(target) as tmp:
            tmp.write_bytes(b'{"half": ')
            raise OSError(errno.ENOSPC, "No space left on device")
    assert target.read_bytes() == OLD
    assert sorted(tmp_path.iterdir()) == [target]


def test_write_atomic_replaces_and_keeps_mode(tmp_path):
    target = tmp_path / "sub" / "out.md"
    write_atomic(target, "new\n")
    assert target.read_text() == "new\n" and (target.stat().st_mode & 0o777) == 0o644
    write_atomic(target, b"newer\n")
    assert target.read_bytes() == b"newer\n" and _temps(target) == []


# ---------------------------------------------------------------------------------------------
# The CLIs, killed at the last moment of their writes.

_HOLD = r"""
import os, sys, time
targets = {os.path.abspath(p) for p in os.environ["TQ_HOLD_TARGETS"].split(os.pathsep)}
marker = os.environ["TQ_HOLD_MARKER"]
pending = set(targets)

def hold(real):
    def f(src, dst, *a, **k):
        d = os.path.abspath(os.fspath(dst))
        if d in pending:                  # an output under test: its new bytes stay in `src`
            pending.discard(d)
            if not pending:
                open(marker, "w").close()
                time.sleep(600)           # killed here
            return None
        return real(src, dst, *a, **k)
    return f

os.replace, os.rename = hold(os.replace), hold(os.rename)
from tqbridge.tools.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    pytest.importorskip("mlx_lm")
    from test_gguf_model import write_synthetic

    return write_synthetic(tmp_path_factory.mktemp("atomic") / "llama.gguf", "llama")


def _run_held(tmp_path: Path, argv: list[str], outputs: dict[str, str], previous: bool = True) -> None:
    """Run ``tqbridge ARGV`` holding back ``outputs`` ({name: kind}); kill it; check nothing was lost."""
    targets = {name: tmp_path / name for name in outputs}
    if previous:
        for p in targets.values():
            p.write_bytes(OLD)
    marker = tmp_path / "held"
    argv = [a.format(**{n.replace(".", "_").replace("-", "_"): str(p) for n, p in targets.items()}) for a in argv]
    env = {**os.environ, "TQ_HOLD_TARGETS": os.pathsep.join(str(p) for p in targets.values()),
           "TQ_HOLD_MARKER": str(marker)}
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, *argv], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(marker, proc, timeout=300)
    try:
        for name, p in targets.items():
            if previous:
                assert p.read_bytes() == OLD, f"{name}: overwritten before the run finished"
            else:
                assert not p.exists(), f"{name}: appeared before the run finished"
            tmps = _temps(p)
            assert len(tmps) == 1, f"{name}: expected one temporary beside it, found {tmps}"
            _check_complete(tmps[0], outputs[name])   # the new output was whole, only its rename was missing
    finally:
        _kill(proc)
    for name, p in targets.items():
        if previous:
            assert p.read_bytes() == OLD, f"{name}: lost its previous contents"
        else:
            assert not p.exists(), f"{name}: a partial output under the final name"


def _check_complete(tmp: Path, kind: str) -> None:
    if kind == "json":
        json.loads(tmp.read_text())
    elif kind == "png":
        assert tmp.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    elif kind == "text":
        assert tmp.read_text().strip()
    elif kind == "gguf":
        assert tmp.read_bytes()[:4] == b"GGUF"
    elif kind == "mlx-dir":
        assert {"config.json", "model.safetensors"} <= {p.name for p in tmp.iterdir()}


def test_selfcheck_json(tmp_path):
    pytest.importorskip("tqbridge.bridge.llama.ggml_c").load()
    _run_held(tmp_path, ["selfcheck", "--formats", "q8_0", "--rows-per-family", "1", "--blocks", "1",
                         "--json", "{s_json}"], {"s.json": "json"})


def test_quality_outputs(tmp_path, synth):
    pytest.importorskip("matplotlib")
    _run_held(tmp_path, ["quality", str(synth), "--kv", "q8_0/q8_0", "--tokens", "24", "--chunk", "12",
                         "--no-progress", "--json", "{q_json}", "--markdown", "{q_md}", "--plot", "{q_png}"],
              {"q.json": "json", "q.md": "text", "q.png": "png"})


def test_parity_outputs(tmp_path, synth):
    pytest.importorskip("matplotlib")
    _run_held(tmp_path, ["parity", str(synth), "--levels", "blocks,logits", "--tokens", "8", "--kv", "q8_0/q8_0",
                         "--quiet", "--json", "{p_json}", "--markdown", "{p_md}", "--plot", "{p_png}"],
              {"p.json": "json", "p.md": "text", "p.png": "png"})


def test_bench_decode_json(tmp_path):
    pytest.importorskip("mlx_lm")
    _run_held(tmp_path, ["bench", "decode", "--models", "tiny", "--context", "80", "--caches", "fp16",
                         "--tokens", "4", "--rounds", "1", "--json", "{b_json}"], {"b.json": "json"})


def test_fuzz_json(tmp_path):
    pytest.importorskip("hypothesis")
    _run_held(tmp_path, ["fuzz", "quantize", "--examples", "3", "--db", str(tmp_path / "db"), "--json", "{f_json}"],
              {"f.json": "json"})


@pytest.mark.parametrize("to,kind", [("gguf-f32", "gguf"), ("mlx", "mlx-dir")])
def test_convert(tmp_path, synth, to, kind):
    _run_held(tmp_path, ["convert", str(synth), "--to", to, "{out}"], {"out": kind}, previous=False)
