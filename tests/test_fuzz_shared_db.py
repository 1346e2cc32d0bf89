"""``tqbridge fuzz --db redis://HOST:PORT``: two fuzzing "machines" (processes with their own cache folders,
sharing nothing but a real redis-server started here) each replay the failing example the other found."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

# Two planted bugs, each on inputs a one-example campaign does not draw by itself (checked below).
PLANTED = """
import numpy as np
from tqbridge import bridge

def deq_blocks(blocks, n):           # wrong from the third block on
    out = bridge.dequantize("q8_0", blocks, n)
    if np.asarray(blocks).shape[0] >= 3:
        out = out.copy()
        out.flat[-1] += 1.0
    return out

def deq_rows(blocks, n):             # wrong on rows of two or more blocks
    out = bridge.dequantize("q8_0", blocks, n)
    if n >= 64:
        out = out.copy()
        out.flat[0] += 1.0
    return out
"""
REDIS_START_S = 10.0


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    pytest.importorskip("redis", reason="the redis package is not installed (the cluster extra)")
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("no redis-server on PATH (Debian: apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(d)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    deadline = time.monotonic() + REDIS_START_S
    up = False
    while not up and proc.poll() is None and time.monotonic() < deadline:
        try:
            up = client.ping()
        except redis.ConnectionError:
            time.sleep(0.1)
    if not up:
        proc.kill()
        proc.wait()
        pytest.skip(f"redis-server did not start on port {port} (exit code {proc.returncode})")
    yield f"redis://127.0.0.1:{port}"
    client.close()
    proc.terminate()
    proc.wait(timeout=10)


def start(machine, target, *args, db, tmp):
    env = {**os.environ, "TQBRIDGE_CACHE": str(tmp / machine / "cache"), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "tqbridge.tools.cli", "fuzz", f"planted:{target}", "--op", "dequantize", "--format",
           "q8_0", *args, "--db", db, "--json", str(tmp / machine / f"{target}.json")]
    return subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p):
    out, err = p.communicate(timeout=300)
    return p.returncode, out + err


def summary(tmp, machine, target):
    return json.loads((tmp / machine / f"{target}.json").read_text())


def test_two_machines_replay_each_others_failures(redis_url, tmp_path):
    (tmp_path / "planted.py").write_text(PLANTED)
    for m in ("m1", "m2", "control"):
        (tmp_path / m).mkdir()
    # control: one example on its own (no shared database) finds neither bug
    controls = [start("control", t, "--examples", "1", "--seed", "2", db=str(tmp_path / "control" / "db"),
                      tmp=tmp_path) for t in ("deq_blocks", "deq_rows")]
    for p in controls:
        rc, log = finish(p)
        assert rc == 0 and "no counterexample" in log, log
    # m1 fuzzes deq_blocks, m2 deq_rows, at the same time, against the same server: each finds its bug
    finders = [start("m1", "deq_blocks", "--examples", "200", "--seed", "1", db=redis_url, tmp=tmp_path),
               start("m2", "deq_rows", "--examples", "200", "--seed", "3", db=redis_url, tmp=tmp_path)]
    for p in finders:
        rc, log = finish(p)
        assert rc == 1 and "COUNTEREXAMPLE" in log and f"shared with  {redis_url}" in log, log
    found = {"deq_blocks": summary(tmp_path, "m1", "deq_blocks"), "deq_rows": summary(tmp_path, "m2", "deq_rows")}
    assert found["deq_blocks"]["shared_database"] == redis_url
    # each then runs one example of the other's target, of which it holds nothing locally: the other's
    # failure comes back from Redis first
    assert not (tmp_path / "m2" / "cache" / "fuzz" / "planted_deq_blocks-dequantize").exists()
    assert not (tmp_path / "m1" / "cache" / "fuzz" / "planted_deq_rows-dequantize").exists()
    replays = [start("m2", "deq_blocks", "--examples", "1", "--seed", "2", db=redis_url, tmp=tmp_path),
               start("m1", "deq_rows", "--examples", "1", "--seed", "2", db=redis_url, tmp=tmp_path)]
    for p in replays:
        rc, log = finish(p)
        assert rc == 1, log
    for machine, target in (("m2", "deq_blocks"), ("m1", "deq_rows")):
        s = summary(tmp_path, machine, target)
        assert s["failure"]["case"] == found[target]["failure"]["case"], (machine, target, s)
