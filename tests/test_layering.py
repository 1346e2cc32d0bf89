"""The package's layering (docs/architecture.md): no import cycles between modules, and each folder
imports only from the folders below it — bridge/ (formats, GGUF, llama.cpp's ABI) from nothing of
ours above it, metal/ from bridge/, parity/ from bridge/ and metal/, tools/ from all three.

Every import counts, the ones inside functions too (a function-level import hides a cycle from
Python's import machinery, not from a reader). Read from the source with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("bridge", "metal", "parity", "tools")      # lowest first: a folder may import those before it


def _modules() -> dict[str, Path]:
    mods = {}
    for top in FOLDERS:
        for p in sorted((ROOT / top).rglob("*.py")):
            parts = list(p.relative_to(ROOT / top).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(["tqbridge", top] + parts)] = p
    return mods


def _imported(mods: dict[str, Path], name: str, node: ast.AST) -> list[str]:
    """The modules of ours that one import statement of module ``name`` names."""
    pkg = name.split(".") if mods[name].name == "__init__.py" else name.split(".")[:-1]
    if isinstance(node, ast.Import):
        wanted = [a.name for a in node.names]
    else:
        if node.level:     # relative: from the module's package, one level up per extra dot
            base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
    out = []
    for w in wanted:
        while w and w not in mods:
            w = w.rpartition(".")[0]
        if w and w != name and not name.startswith(w + "."):   # a package's own __init__ is not an edge
            out.append(w)
    return out


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module of ours: line of the first such import}."""
    mods = _modules()
    graph: dict[str, dict[str, int]] = {m: {} for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for d in _imported(mods, m, node):
                    graph[m].setdefault(d, node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _edges_within(graph, comp) -> list[str]:
    s = set(comp)
    return [f"{m} -> {d} (line {ln})" for m in comp for d, ln in graph[m].items() if d in s]


def test_no_import_cycles():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "\n".join("cycle: " + "; ".join(_edges_within(graph, c)) for c in found)


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import of a module from a folder above its own, as ``a -> b (line n)``."""
    rank = {f: i for i, f in enumerate(FOLDERS)}
    return [f"{m} -> {d} (line {ln})" for m, ds in graph.items() for d, ln in ds.items()
            if rank[d.split(".")[1]] > rank[m.split(".")[1]]]


def test_each_folder_imports_only_the_folders_below_it():
    bad = upward_imports(import_graph())
    assert not bad, "\n".join(bad)


def test_the_checker_sees_a_planted_cycle_and_a_planted_upward_import():
    # the two verdicts above must be able to fail: a graph with a cycle and an upward edge added
    graph = import_graph()
    a, b = "tqbridge.bridge.blocks.registry", "tqbridge.metal.attention"
    graph[a] = {**graph[a], b: 1}
    graph[b] = {**graph[b], a: 1}
    assert any(a in c and b in c for c in cycles(graph))
    # the verdict itself run on that graph: bridge -> metal is upward, metal -> bridge is not
    assert upward_imports(graph) == [f"{a} -> {b} (line 1)"]


def test_relative_imports_resolve_to_our_modules():
    # `from .cache import X` in metal/lm/routing.py is the edge routing -> cache
    graph = import_graph()
    assert "tqbridge.metal.lm.cache" in graph["tqbridge.metal.lm.routing"]
    assert "tqbridge.bridge.blocks.format_types" in graph["tqbridge.bridge.blocks.turbo"]
