"""Every number the pages state is a record's value: README.md, BENCHMARKS.md and docs/*.md against the
records (benchmarks/records/<hardware>/*.json, read through their schema, tools/records.py; docs/*.json).

Two ways a page ties a number to a record, both read here and nowhere else:

- **A generated table.** An HTML comment holds the table's spec: the record, the heading row, then one
  line per row ``label | key | format``; the Markdown table right below it must be exactly what the spec
  renders from the record. ``<col>`` in a key is the column's heading (4K, 32K, 128K read as their length
  in tokens); keys are :func:`tqbridge.tools.records.lookup`'s. Formats: Python's (``.2f``, ``.1%``,
  ``,.0f``, ``.3g``), ``e1``/``e2`` (``1.9e-4``: a mantissa of that many decimals), ``s`` (the value as
  text), a format string (``{:.2f}x``); one for every column, or one per column separated by ``;``. A
  heading ``top-1=top1`` prints ``top-1`` and puts ``top1`` for ``<col>``; ``<row>`` is the row's label,
  and a line holding a label alone takes the key and format of the row above.
  ``python tests/test_doc_claims.py --write`` renders every table from its spec. A changed number, a
  deleted or added row fails.

      <!-- table benchmarks/records/h200/X.json
      measure | 4K | 32K
      device time, µs | rows[context=<col>].device_us | .2f
      -->

- **An inline key.** A link to the record whose title is the key: ``[13.22 µs](benchmarks/records/h200/
  X.json "rows[context=4096].device_us")``; the first number of the link's text must be the value rounded
  to the digits printed (text ending in ``%``: the value as a percentage).

README.md and BENCHMARKS.md state no measured number any other way: a table with a cell that is a number
(or a number with a unit of measure) is a generated table, or is marked ``<!-- not measured: why -->`` (facts of the code, such as the formats'
sizes, checked against the registry below); a number in their prose followed by a unit of measure (µs,
ms, s, ×, %, MiB, GiB, tokens/s) sits in an inline key. docs/ pages use the same two forms; their other
numbers describe the code (checked by the tests of that code) or name records by path.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
STRICT = ("README.md", "BENCHMARKS.md")
CTX_NAMES = {"1K": 1024, "2K": 2048, "4K": 4096, "8K": 8192, "16K": 16384, "32K": 32768, "64K": 65536,
             "128K": 131072}
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")
SPEC = re.compile(r"<!-- table (\S+\.json)\n(.*?)\n-->\n((?:\|[^\n]*\n?)+)", re.S)
INLINE = re.compile(r"\[([^\]]+)\]\(((?:\.\./)?(?:benchmarks|docs)/[^)\s]+\.json) \"([^\"]+)\"\)")
UNMEASURED = re.compile(r"<!-- not measured: [^>]+ -->\n((?:\|[^\n]*\n?)+)")
UNIT = r"(?:µs|us|ms|s|×|x|%|MiB|GiB|KiB|MB|GB|tokens/s|tok/s)(?![\w])"
STRAY = re.compile(r"(?<![\w.@/-])(\d[\d,]*(?:\.\d+)?(?:e-?\d+)?)\s?" + UNIT)


def record(path: Path):
    """A record's results (benchmarks/records/: checked against its schema first), or a docs/*.json as it is."""
    from tqbridge.tools.records import results

    if "benchmarks/records/" in path.as_posix():
        return results(path)
    return json.loads(path.read_text())


def lookup(res, key: str):
    from tqbridge.tools.records import lookup as _lookup

    return _lookup(res, key)


def fmt(value, spec: str) -> str:
    """``value`` as the page prints it under ``spec``."""
    if spec == "s":
        return str(value)
    if "{" in spec:                  # a format string around the value: "{:.2f}x"
        return spec.format(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is not a number (format {spec!r})")
    if spec.startswith("e"):
        mant, _, exp = f"{value:.{int(spec[1:])}e}".partition("e")
        return f"{mant}e{int(exp)}"
    return format(value, spec)


# ---- generated tables ------------------------------------------------------------------------------

def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def render(spec_lines: str, res) -> list[str]:
    """The Markdown table a spec renders from a record's results."""
    lines = [ln for ln in spec_lines.splitlines() if ln.strip()]
    head = _cells(lines[0])
    out = ["| " + " | ".join(c.split("=", 1)[0].strip() for c in head) + " |", "|" + "---|" * len(head)]
    key = spec = ""
    for ln in lines[1:]:
        if ln.count("|") >= 2:
            label, key, spec = (c.strip() for c in ln.rsplit("|", 2))
        else:                        # a label alone: the key and format of the row above
            label = ln.strip()
        specs = spec.split(";") if ";" in spec else [spec] * (len(head) - 1)   # one per column, or one for all
        row = [label]
        for col, sp in zip(head[1:], specs):
            where = col.split("=", 1)[1] if "=" in col else str(CTX_NAMES.get(col, col))
            row.append(fmt(lookup(res, key.replace("<col>", where).replace("<row>", label)), sp))
        out.append("| " + " | ".join(row) + " |")
    return out


def generated_tables(body: str, page: Path) -> list[tuple[str, list[str], list[str]]]:
    """``(record path, rendered lines, page lines)`` for each spec of a page."""
    out = []
    for m in SPEC.finditer(body):
        path = (page.parent / m.group(1)).resolve()
        try:
            want = render(m.group(2), record(path))
        except (KeyError, ValueError, OSError) as e:
            want = [f"cannot render: {e}"]
        got = ["| " + " | ".join(_cells(ln)) + " |" if not set(ln.replace("|", "").strip()) <= set("-: ")
               else "|" + "---|" * len(_cells(ln)) for ln in m.group(3).strip().splitlines()]
        out.append((m.group(1), want, got))
    return out


def write_tables(page: Path) -> bool:
    """Render every spec of ``page`` into the table below it; True when the page changed."""
    body = page.read_text()

    def fill(m):
        want = render(m.group(2), record((page.parent / m.group(1)).resolve()))
        return f"<!-- table {m.group(1)}\n{m.group(2)}\n-->\n" + "\n".join(want) + "\n"
    new = SPEC.sub(fill, body)
    if new != body:
        page.write_text(new)
    return new != body


# ---- the checks, on a page's text ------------------------------------------------------------------

def rounds_to(shown: str, value: float, scale: "float | None" = None) -> bool:
    """Whether the first number of ``shown`` is ``value * scale`` rounded to its digits (no ``scale``:
    × 100 where the number is followed by ``%``)."""
    m = NUMBER.search(shown.replace("\u2212", "-"))
    if not m or isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    s = m.group(0).replace(",", "")
    if scale is None:
        scale = 100 if shown[m.end():].lstrip().startswith("%") else 1
    mant, _, exp = s.partition("e")
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    return abs(float(s) - value * scale) <= 0.5 * 10.0 ** (int(exp or 0) - decimals) * (1 + 1e-9) + 1e-12


def table(doc: str, header_start: str, after: str = "") -> list[list[str]]:
    """Body rows (cells stripped) of the first Markdown table whose header starts with ``header_start``
    (after the first occurrence of ``after``)."""
    lines = doc[doc.index(after):].splitlines() if after else doc.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith(header_start):
            rows = []
            for body in lines[i + 2:]:
                if not body.strip().startswith("|"):
                    break
                rows.append(_cells(body))
            assert rows, header_start
            return rows
    raise AssertionError(f"no table starting {header_start!r}")


def problems(body: str, page: Path, strict: bool) -> list[str]:
    """What on ``page`` (its text ``body``) is not a record's value, or is a number without a record."""
    bad = []
    for rec, want, got in generated_tables(body, page):
        if want != got:
            diff = [f"page {g!r} != record {w!r}" for w, g in zip(want, got) if w != g]
            if len(want) != len(got):
                diff.append(f"{len(got) - 2} rows on the page, {len(want) - 2} in the spec")
            bad.append(f"{page.name}: table of {rec}: " + "; ".join(diff))
    for text_, path, key in INLINE.findall(body):
        try:
            value = lookup(record((page.parent / path).resolve()), key)
        except (KeyError, OSError) as e:
            bad.append(f"{page.name}: [{text_}] {path} {key!r}: {e}")
            continue
        if not rounds_to(text_, value):
            bad.append(f"{page.name}: [{text_}] is not {path} {key} = {value!r}")
    if strict:
        rest = SPEC.sub("", body)
        rest = UNMEASURED.sub("", rest)
        for line in rest.splitlines():
            cells = [re.sub(r"`[^`]*`|\[[^\]]*\]\([^)]*\)", " ", c) for c in _cells(line)[1:]]
            if line.strip().startswith("|") and any(
                    re.fullmatch(NUMBER.pattern + r"\s?(?:" + UNIT + r")?", c.strip()) or STRAY.search(c) for c in cells):
                bad.append(f"{page.name}: a table's numbers without a record: {line.strip()[:100]}")
        prose = "\n".join(ln for ln in rest.splitlines() if not ln.strip().startswith("|"))
        prose = INLINE.sub(" ", prose)
        prose = re.sub(r"`[^`]*`|\]\([^)]*\)|<!--.*?-->", " ", prose, flags=re.S)
        for m in STRAY.finditer(prose):
            bad.append(f"{page.name}: {m.group(0)!r} states a measurement without a record key")
    return bad


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_number_on_the_page_is_its_records(page):
    assert not problems(page.read_text(), page, page.name in STRICT), "\n".join(
        problems(page.read_text(), page, page.name in STRICT))


def test_the_strict_pages_tie_their_numbers_to_records():
    # the two pages a reader starts from carry generated tables and inline keys, not bare numbers
    for name in STRICT:
        body = (ROOT / name).read_text()
        assert generated_tables(body, ROOT / name) or INLINE.search(body), name
    assert len(generated_tables((ROOT / "BENCHMARKS.md").read_text(), ROOT / "BENCHMARKS.md")) >= 5


# ---- the check fails where it must (planted on copies of the pages) ---------------------------------

def _first_table(page: str) -> "tuple[str, re.Match]":
    body = (ROOT / page).read_text()
    m = SPEC.search(body)
    assert m, page
    return body, m


def test_a_changed_number_fails():
    body, m = _first_table("BENCHMARKS.md")
    table = m.group(3)
    row = table.splitlines()[2]
    cell = NUMBER.findall(row.split("|", 2)[2])[0]
    bumped = row.replace(cell, str(float(cell.replace(",", "")) + 1), 1)
    found = problems(body.replace(row, bumped, 1), ROOT / "BENCHMARKS.md", True)
    assert len(found) == 1 and "page" in found[0] and "record" in found[0], found


def test_a_deleted_row_fails():
    body, m = _first_table("BENCHMARKS.md")
    row = m.group(3).splitlines()[2]
    found = problems(body.replace(row + "\n", "", 1), ROOT / "BENCHMARKS.md", True)
    assert found and "rows on the page" in found[0], found


def test_a_number_without_a_record_fails():
    page = ROOT / "BENCHMARKS.md"
    body = page.read_text()
    assert not problems(body, page, True)
    # in prose, in a table of its own, and as an inline key the record does not hold
    assert problems(body + "\nThe kernel now takes 12.5 µs per call.\n", page, True)
    assert problems(body + "\n| measure | 4K |\n|---|---|\n| device time, µs | 12.5 |\n", page, True)
    inline = INLINE.search((ROOT / "README.md").read_text())
    assert inline, "README quotes no inline key"
    text_, path, key = inline.groups()
    wrong = f'[{text_}]({path} "{key}.no_such_field")'
    assert problems(wrong, ROOT / "README.md", False)
    n = NUMBER.search(text_).group(0)
    changed = f'[{text_.replace(n, str(float(n.replace(",", "")) * 3 + 1), 1)}]({path} "{key}")'
    assert problems(changed, ROOT / "README.md", False)


def test_a_unit_without_a_number_passes_and_a_number_without_a_unit_is_prose():
    page = ROOT / "README.md"
    assert not problems("Two commands; head dim 128; the 8B shape; `12 µs` in code.\n", page, True)
    assert problems("It takes 3 ms.\n", page, True) and problems("1.2× faster\n", page, True)


# ---- links and the files they name ------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)(?: \"[^\"]*\")?\)")
REPO_PATH = re.compile(r"(?<![\w/.-])((?:benchmarks|docs|tests|bridge|metal|parity|tools)/(?:[\w.-]+/)*[\w.-]+"
                       r"\.(?:json|py|png|md|cpp|c|h))\b")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_and_cited_files_exist(doc):
    body = doc.read_text()
    missing = []
    for target in LINK.findall(body):
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        path = target.split("#")[0]
        if path and not (doc.parent / path).exists():
            missing.append(target)
    # the kernel history names the test files it deleted (and the old names the records use)
    gone = set(re.findall(r"tests/[\w.]+\.py", (ROOT / "docs" / "kernel-history.md").read_text()))
    for path in REPO_PATH.findall(body):
        if not (ROOT / path).exists() and not (doc.parent / path).exists() and not (ROOT / "metal" / path).exists():
            if not (doc.name == "kernel-history.md" and path in gone and "Deleted with" in body):
                missing.append(path)
    assert not missing, f"{doc.name}: {missing}"


def dialect_names_missing(page: str, sources: str) -> list:
    """The dialect's names a table row of ``page`` documents (`tq_*` / `TQ_*` in its first cell) that
    ``sources`` never spells."""
    missing = []
    for line in page.splitlines():
        if not line.startswith("| `"):
            continue
        for name in re.findall(r"`((?:tq|TQ)_\w+)", line.split(" | ")[0]):
            if not re.search(r"\b" + re.escape(name) + r"\b", sources):
                missing.append(name)
    return missing


def test_the_dialect_page_names_only_what_the_kernels_define():
    # the preludes and headers, and the thread-id bindings the kernel builder writes (metal/kernel.py)
    sources = "\n".join(p.read_text() for p in [*sorted((ROOT / "metal" / "kernels").glob("*.h")),
                                                  ROOT / "metal" / "kernel.py"])
    page = (ROOT / "docs" / "kernels.md").read_text()
    assert page.count("| `tq_") > 20   # the tables are where this test reads them
    assert not dialect_names_missing(page, sources)
    # a row for a primitive that was deleted with its kernel fails
    assert dialect_names_missing(page + "\n| `tq_device_fence()`, `tq_atomic_inc(p)` | a fence |\n", sources) == \
        ["tq_device_fence", "tq_atomic_inc"]


def test_nothing_names_work_by_an_ordinal():
    # history is dated and tied to commits and records (issue 50): no work session named by its ordinal in any page,
    # test, script, source or record of the repository
    ordinal = re.compile(r"\b(first|second|third|[a-z]+th|[a-z]+-[a-z]+th) " + "session", re.I)
    folders = ("bridge", "metal", "parity", "tools", "tests", "benchmarks", "docs")
    files = [*ROOT.glob("*.md"), *(p for f in folders for p in (ROOT / f).rglob("*")
                                   if p.suffix in (".py", ".md", ".json", ".cpp", ".h", ".c", ".toml"))]
    found = [str(p.relative_to(ROOT)) for p in files if ordinal.search(p.read_text(errors="replace"))]
    assert not found, found
    assert ordinal.search("the twenty-first " + "session") and ordinal.search("Eighth " + "session")


# ---- the formats table: the registry ----------------------------------------------------------------

def _format_key(cell: str) -> str:
    name = cell.split()[0].strip("`")
    m = re.search(r"\(`@([\w-]+)`\)", cell)
    return f"{name}@{m.group(1)}" if m else name


def test_formats_table_is_the_registry():
    from tqbridge import bridge

    rows = table((ROOT / "docs" / "formats-ggml.md").read_text(), "| name | values/block")
    assert sorted(bridge.get_format(_format_key(r[0])).key for r in rows) == sorted(f.key for f in bridge.all_formats())
    bad = []
    for row in rows:
        f = bridge.get_format(_format_key(row[0]))
        if not (int(row[1]) == f.block_size and int(row[2]) == f.type_size and rounds_to(row[3], f.bits_per_value)
                and rounds_to(row[4], f.compression_vs_f16)):
            bad.append(row[0])
        ids = set(f.type_ids.values()) if isinstance(f.type_ids, dict) else {f.type_ids}
        if not (int(row[5].split()[0]) in ids if ids - {None} else row[5].startswith("–")):
            bad.append(f"{row[0]} type id {row[5]} vs {f.type_ids}")
    assert not bad, bad


def test_formats_command_rounds_the_ratio_once(capsys):
    """16 / 4.25 = 3.7647: printed 3.76x (rounding the JSON's 3.765 again printed 3.77x)."""
    from tqbridge import bridge
    from tqbridge.tools.cli import main

    assert main(["formats"]) == 0
    out = capsys.readouterr().out
    for line in out.splitlines()[2:]:
        f = bridge.get_format(line.split()[0])
        assert f"{f.compression_vs_f16:.2f}x" in line.split(), line


# ---- sizes of the documentation (issue 50) ----------------------------------------------------------

README_WORDS = 1800
ALL_WORDS = 35000


def test_the_docs_are_read_in_minutes():
    words = {p.name: len(p.read_text().split()) for p in DOCS}
    assert words["README.md"] <= README_WORDS, words["README.md"]
    assert sum(words.values()) <= ALL_WORDS, sum(words.values())


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        for p in DOCS:
            if write_tables(p):
                print("rendered", p.relative_to(ROOT))
    else:
        sys.exit("usage: python tests/test_doc_claims.py --write   (render every table from its spec)")
