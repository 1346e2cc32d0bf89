"""``tqbridge campaign``: a matrix of tqbridge commands as Ray tasks on a two-node Ray cluster started here
(ray.cluster_utils.Cluster, two raylets on this machine), a worker killed mid-cell and the cell retried,
a failing cell reported with its command line, resume; the spec's one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tqbridge.tools.cli import main

SPEC = """
name = "two-nodes"
retries = 2

[[cells]]
command = "formats"

[[cells]]
command = "archs"
args = ["--parity", "{arch}", "--quiet"]
matrix = { arch = ["llama", "nosucharch"] }

[[cells]]
command = "selfcheck"
num_gpus = 1
"""
KILLED = "tqbridge archs --parity llama --quiet"
FAILING = "tqbridge archs --parity nosucharch --quiet"
CLI_TIMEOUT_S = 240          # a bound on one campaign run (~20 s here), not a speed claim


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed (the cluster extra)")
    from ray.cluster_utils import Cluster

    small = {"num_cpus": 1, "include_dashboard": False, "object_store_memory": 80 << 20}
    c = Cluster(initialize_head=True, head_node_args=small)
    c.add_node(**small)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


def campaign(*args, cwd, on_line=None):
    """Run the CLI; ``on_line(line, proc)`` sees each stderr line as it comes."""
    p = subprocess.Popen([sys.executable, "-m", "tqbridge.tools.cli", "campaign", *args], cwd=cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = []
    deadline = time.monotonic() + CLI_TIMEOUT_S
    for line in p.stderr:
        err.append(line)
        if on_line is not None:
            on_line(line, p)
        assert time.monotonic() < deadline, "".join(err)
    out = p.stdout.read()
    p.wait(timeout=60)
    return p.returncode, out, "".join(err)


def test_matrix_on_two_nodes_with_a_killed_worker_a_failing_cell_and_resume(cluster, tmp_path):
    (tmp_path / "spec.toml").write_text(SPEC)
    killed = []

    def kill_first_attempt(line, proc):
        # "[i/n] start  tqbridge archs --parity llama --quiet (on HOST pid PID)": the Ray worker running it
        if not killed and f"start  {KILLED} (on" in line:
            pid = int(line.rsplit("pid ", 1)[1].split(")")[0].split(",")[0])
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    rc, out, err = campaign("spec.toml", "--address", cluster.address, "--out", "out", cwd=tmp_path,
                            on_line=kill_first_attempt)
    assert killed, err
    assert rc == 1, out + err                                   # one cell errs
    rec = json.loads((tmp_path / "out" / "campaign.json").read_text())
    cells = {c["command_line"]: c for c in rec["cells"]}
    assert rec["ray"]["nodes"] == 2 and rec["summary"] == {"cells": 4, "pass": 2, "fail": 0, "error": 2, "pending": 0}
    # the killed cell ran again, to the end: attempt 2, its report complete
    k = cells[KILLED]
    assert k["status"] == "pass" and k["attempts"] == 2 and k["exit_code"] == 0, k
    assert k["report"]["passed"] is True and [a["arch"] for a in k["report"]["archs"]] == ["llama"]
    assert f"start  {KILLED} (on" in err and "attempt 2)" in err
    # formats' JSON arrived from stdout
    f = cells["tqbridge formats"]
    assert f["status"] == "pass" and any(x["name"] == "q8_0" for x in f["report"]), f
    # the failing cell: reported with its command line, the others kept
    bad = cells[FAILING]
    assert bad["status"] == "error" and bad["exit_code"] == 2 and "no tiny fixture for nosucharch" in bad["error"]
    assert f"error  {FAILING}" in out and "no tiny fixture for nosucharch" in out
    # one CPU per node, one cell per CPU: the cells a node ran do not overlap in time
    spans = sorted((c["node"], c["started_at"], c["started_at"] + c["seconds"]) for c in rec["cells"] if c["node"])
    assert all(a[0] != b[0] or b[1] >= a[2] for a, b in zip(spans, spans[1:])), spans
    # a cell no node can take (a GPU on a CPU cluster) is an error at once, not a wait for ever
    gpu = cells["tqbridge selfcheck"]
    assert gpu["status"] == "error" and gpu["error"] == "no node of the Ray cluster has CPU 1, GPU 1 (the cell's resources)"
    md = (tmp_path / "out" / "campaign.md").read_text()
    assert f"`{FAILING}` | error" in md and f"`{KILLED}` | pass" in md
    # two cells ran at once, one on each node (each node has one CPU)
    started_on = {line.split(" node ")[1].split()[0] for line in err.splitlines() if " start  " in line}
    assert len(started_on) == 2 and all(c["node"][:8] in started_on for c in rec["cells"] if c["node"]), err

    # resume: the two finished cells are skipped (their entries unchanged), the failed one runs again
    rc, out, err = campaign("spec.toml", "--address", cluster.address, "--out", "out", cwd=tmp_path)
    assert rc == 1, out + err
    again = {c["command_line"]: c for c in json.loads((tmp_path / "out" / "campaign.json").read_text())["cells"]}
    assert f"skip   {KILLED}" in err and "skip   tqbridge formats" in err and f"start  {FAILING}" in err
    assert f"start  {KILLED}" not in err and "start  tqbridge formats" not in err
    assert again[KILLED] == k and again["tqbridge formats"] == f
    assert again[FAILING]["status"] == "error" and "(2 finished before)" in out


FUZZ_SPEC = """
[[cells]]
command = "formats"

[[cells]]
command = "fuzz"
args = ["{target}", "--op", "dequantize", "--format", "q8_0", "--examples", "5", "--db", "db"]
matrix = { target = ["mine:deq", "mine:deq_wrong"] }
"""
MINE = (
    "import numpy as np\n"
    "from tqbridge import bridge\n"
    "def deq(blocks, n):\n"
    "    return bridge.dequantize('q8_0', blocks, n)\n"
    "def deq_wrong(blocks, n):\n"
    "    return bridge.dequantize('q8_0', blocks, n) + 1.0\n")


def test_a_driver_killed_mid_campaign_keeps_finished_cells_and_resume_runs_the_rest(cluster, tmp_path):
    (tmp_path / "spec.toml").write_text(
        '[[cells]]\ncommand = "archs"\nargs = ["--parity", "{arch}", "--tokens", "16", "--decode", "2", "--quiet"]\n'
        'matrix = { arch = ["llama", "qwen2", "qwen3", "phi3"] }\n')
    killed = []

    def kill_driver_at_first_result(line, proc):
        if not killed and "] pass   tqbridge archs" in line:
            proc.send_signal(signal.SIGKILL)            # no chance to write anything more
            killed.append(line)

    rc, out, err = campaign("spec.toml", "--address", cluster.address, "--out", "out", cwd=tmp_path,
                            on_line=kill_driver_at_first_result)
    assert killed and rc == -signal.SIGKILL, err
    rec = json.loads((tmp_path / "out" / "campaign.json").read_text())   # whole: written atomically
    done = {c["command_line"] for c in rec["cells"] if c["status"] == "pass"}
    assert 1 <= len(done) < 4 and rec["summary"]["pending"] == 4 - len(done), rec["summary"]
    assert killed[0].split("pass   ")[1].split(" (")[0] in done
    rc, out, err = campaign("spec.toml", "--address", cluster.address, "--out", "out", cwd=tmp_path)
    assert rc == 0, out + err
    assert all(f"skip   {c}" in err and f"start  {c} " not in err for c in done), err
    assert err.count("start  tqbridge archs") == 4 - len(done)
    assert json.loads((tmp_path / "out" / "campaign.json").read_text())["summary"]["pass"] == 4


def test_serial_run_spreads_fuzz_targets_as_cells(tmp_path, capsys, monkeypatch):
    """Fuzz targets as cells (a user's module, found in the campaign's folder); --serial runs without Ray."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(FUZZ_SPEC)
    (tmp_path / "mine.py").write_text(MINE)
    assert main(["campaign", "s.toml", "--serial", "--out", "o"]) == 1
    rec = json.loads((tmp_path / "o" / "campaign.json").read_text())
    assert rec["ray"]["mode"] == "serial" and rec["summary"]["pass"] == 2 and rec["summary"]["fail"] == 1
    cells = {c["argv"][1]: c for c in rec["cells"] if c["command"] == "fuzz"}
    assert cells["mine:deq"]["status"] == "pass" and cells["mine:deq"]["report"]["examples"] >= 5
    bad = cells["mine:deq_wrong"]
    assert bad["status"] == "fail" and bad["report"]["failure"]["case"].startswith("Case(dequantize, q8_0")
    assert "fail   tqbridge fuzz mine:deq_wrong" in capsys.readouterr().out


@pytest.mark.parametrize("spec, message", [
    ("", "no cells: add one or more [[cells]] groups"),
    ('[[cells]]\ncommand = "evidence"\n', "command 'evidence' is not one a cell can run (evidence is not"),
    ('[[cells]]\ncommand = "archs"\nmodels = ["smollm2"]\n', "archs takes no models axis"),
    ('[[cells]]\ncommand = "archs"\nargs = ["--parity", "{arch}"]\n', "args use {arch} but matrix has no such axis"),
    ('[[cells]]\ncommand = "archs"\nmatrix = { arch = ["llama"] }\n', "matrix axis 'arch' is not used in args"),
    ('[[cells]]\ncommand = "formats"\nnum_cpus = -1\n', "num_cpus must be a number >= 0"),
    ('[[cells]]\ncommand = "formats"\nargs = ["--json", "x"]\n', "leave --json out of args"),
    ('[[cells]]\ncommand = "formats"\n[[cells]]\ncommand = "formats"\n', "appears twice"),
    ('[[cells]\n', "not valid TOML"),
    ('retry = 1\n[[cells]]\ncommand = "formats"\n', "unknown setting(s) retry"),
])
def test_spec_errors_are_one_line(tmp_path, capsys, monkeypatch, spec, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(spec)
    assert main(["campaign", "s.toml", "--serial"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "campaign-s").exists()


def test_matrix_expansion_puts_known_axes_where_the_command_takes_them():
    from tqbridge.parity.campaign import expand

    cells = expand({"cells": [{"command": "parity", "models": ["smollm2", "gemma3"], "kv": ["q8_0/q8_0", "q4_0/q4_0"],
                               "levels": "blocks", "args": ["--tokens", "{n}"], "matrix": {"n": [16, 32]},
                               "num_cpus": 2, "resources": {"fork": 1}}]})
    assert len(cells) == 8 and len({c.id for c in cells}) == 8
    assert cells[0].argv == ["parity", "smollm2", "--kv", "q8_0/q8_0", "--levels", "blocks", "--tokens", "16"]
    assert cells[-1].argv == ["parity", "gemma3", "--kv", "q4_0/q4_0", "--levels", "blocks", "--tokens", "32"]
    assert cells[0].num_cpus == 2 and cells[0].resources == {"fork": 1} and cells[0].retries == 2


def test_an_unreachable_cluster_is_one_line(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ray", reason="Ray is not installed (the cluster extra)")
    import socket

    with socket.socket() as s:          # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text('[[cells]]\ncommand = "formats"\n')
    assert main(["campaign", "s.toml", "--address", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert f"cannot reach a Ray cluster at 127.0.0.1:{port}" in err and len(err.strip().splitlines()) == 1, err


def test_without_ray_the_command_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "ray", None)          # import ray -> ImportError, as without the extra
    (tmp_path / "s.toml").write_text('[[cells]]\ncommand = "formats"\n')
    assert main(["campaign", "s.toml"]) == 2
    err = capsys.readouterr().err
    assert "needs Ray: pip install 'tqbridge[cluster]'" in err and len(err.strip().splitlines()) == 1
