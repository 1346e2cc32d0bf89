"""The benchmark records (benchmarks/records/<hardware>/*.json) follow one schema, and
benchmarks/INDEX.md is what ``tqbridge records index`` makes of them (tools/records.py)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tqbridge.tools import records as R

ROOT = Path(__file__).resolve().parents[1]
PATHS = R.paths(ROOT)


def _full_history() -> bool:
    """Whether ROOT is a git checkout with its whole history (not a shallow clone, not an unpacked copy)."""
    try:
        p = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return False
    return p.returncode == 0 and p.stdout.strip() == "false"


FULL_HISTORY = _full_history()


def test_records_are_found_in_hardware_folders():
    assert len(PATHS) >= 70
    assert {p.parent.name for p in PATHS} >= {"h200", "cpu", "nvcc"}
    # nothing else lies in benchmarks/records/: a record outside a hardware folder would escape the checks
    stray = [p for p in (ROOT / R.RECORDS).rglob("*") if p.is_file() and p not in PATHS]
    assert not stray, stray


@pytest.mark.parametrize("path", PATHS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_record_follows_the_schema(path):
    rec = json.loads(path.read_text())
    assert R.problems(rec, path) == []
    if rec["commit"] is not None and FULL_HISTORY:
        # the commit must name a commit of this repository's history (where the checkout holds all of it)
        p = subprocess.run(["git", "cat-file", "-t", rec["commit"]], cwd=ROOT, capture_output=True, text=True)
        assert p.stdout.strip() == "commit", (rec["commit"], p.stderr)


def test_index_is_generated_from_the_records():
    committed = (ROOT / R.INDEX).read_text()
    assert committed == R.index_markdown(ROOT), "benchmarks/INDEX.md is stale: run `tqbridge records index`"
    for p in PATHS:   # every record is linked from the index, once
        assert committed.count(f"]({p.relative_to(ROOT / 'benchmarks').as_posix()})") == 1, p


def test_cli_index_check_and_check(tmp_path):
    def cli(*args, root=ROOT):
        return subprocess.run([sys.executable, "-m", "tqbridge.tools.cli", "records", "--root", str(root), *args],
                              capture_output=True, text=True)

    assert cli("check").returncode == 0
    assert cli("index", "--check").returncode == 0
    # a copy whose one record breaks the schema, and whose index is then stale
    (tmp_path / "benchmarks" / "records" / "cpu").mkdir(parents=True)
    src = ROOT / R.RECORDS / "cpu" / "2026-12-01-demo.json"
    dst = tmp_path / R.RECORDS / "cpu" / src.name
    rec = json.loads(src.read_text())
    dst.write_text(R.dumps(rec))
    assert cli("index", root=tmp_path).returncode == 0
    assert cli("index", "--check", root=tmp_path).returncode == 0
    rec["date"] = "2026-12-02"
    dst.write_text(R.dumps(rec))
    p = cli("check", root=tmp_path)
    assert p.returncode == 1 and "file name's date 2026-12-01 != date '2026-12-02'" in p.stdout, p.stdout
    assert cli("index", "--check", root=tmp_path).returncode == 1


GOOD = {"schema": 1, "hardware": "cpu", "date": "2026-12-01", "commit": None, "commit_source": None,
        "command": "tqbridge demo", "machine": {"nproc": 2}, "versions": {"mlx": "0.32.4"}, "results": {"x": 1}}


@pytest.mark.parametrize("edit, says", [
    (lambda r: r.pop("versions"), "keys"),
    (lambda r: r.update(schema=2), "schema 2"),
    (lambda r: r.update(date="2026-13-01"), "date"),
    (lambda r: r.update(commit="abc", commit_source="recorded"), "hex"),
    (lambda r: r.update(commit="0123abcd"), "commit_source None"),
    (lambda r: r.update(commit_source="added-in"), "without a commit"),
    (lambda r: r.update(command=""), "command"),
    (lambda r: r.update(versions={"mlx": 0.32}), "versions"),
    (lambda r: r.update(results={}), "results"),
    (lambda r: r.update(hardware="H200 GPU"), "hardware"),
])
def test_schema_refuses(edit, says):
    assert R.problems(GOOD, Path("benchmarks/records/cpu/2026-12-01-demo.json")) == []
    rec = copy.deepcopy(GOOD)
    edit(rec)
    bad = R.problems(rec)
    assert bad and any(says in b for b in bad), bad


def test_file_name_and_folder_must_match():
    assert any("folder" in b for b in R.problems(GOOD, Path("benchmarks/records/h200/2026-12-01-demo.json")))
    assert any("date" in b for b in R.problems(GOOD, Path("benchmarks/records/cpu/2026-12-02-demo.json")))
    assert any("file name" in b for b in R.problems(GOOD, Path("benchmarks/records/cpu/demo.json")))


def test_lookup():
    res = {"runs": [{"cache": "fp16", "context": 4096, "ms": 1.0}, {"cache": "q8_0/turbo3", "context": 4096, "ms": 2.0},
                    {"cache": "q8_0/turbo3", "context": 32768, "ms": 3.0, "env": {}}], "copy": {"GBps": 4.1}}
    assert R.lookup(res, "copy.GBps") == 4.1
    assert R.lookup(res, "runs[1].ms") == 2.0
    assert R.lookup(res, "runs[context=32768].ms") == 3.0
    assert R.lookup(res, "runs[env={}].ms") == 3.0
    assert R.lookup(res, "runs[cache=q8_0/turbo3&context=4096].ms") == 2.0
    for key in ("runs[cache=q8_0/turbo3].ms", "runs[context=1].ms", "copy.MBps", "runs[5]", "runs[cache=fp16&context=1]",
                "copy..GBps", "copy.GBps.x"):
        with pytest.raises(KeyError):
            R.lookup(res, key)


def test_add_files_a_report(tmp_path):
    report = tmp_path / "bench.json"
    report.write_text(json.dumps({"rows": [{"context": 4096, "us": 12.5}]}))
    cmd = [sys.executable, "-m", "tqbridge.tools.cli", "records", "--root", str(tmp_path), "add", str(report),
           "--hardware", "h200", "--what", "bench-attention", "--command", "tqbridge bench attention --json OUT"]
    assert subprocess.run(cmd, capture_output=True, text=True).returncode == 0
    (path,) = R.paths(tmp_path)
    rec = R.load(path)
    assert rec["results"] == json.loads(report.read_text()) and rec["command"] == "tqbridge bench attention --json OUT"
    assert rec["commit"] is None   # tmp_path is no git checkout: no commit is claimed
    assert rec["versions"]["tqbridge"] and rec["machine"]["nproc"]
    p = subprocess.run(cmd, capture_output=True, text=True)   # the same name again: refused, not overwritten
    assert p.returncode != 0 and "exists" in p.stderr
