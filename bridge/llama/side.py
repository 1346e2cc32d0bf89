"""This process's llama.cpp side: which build it is, where its ggml libraries are, and the ggml type
ids it gives the registry's formats.

The side is llama-cpp-python's own build unless a build directory was chosen with
:func:`tqbridge.bridge.llama.build.select` (one process, one build; ``--llama`` on the command line).
Everything that loads ggml (:mod:`.ggml_c`, :mod:`.ggml_graph`, :mod:`.llama_compat`, the runtimes)
asks this module which libraries to load.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..blocks.format_types import FormatError
from ..blocks.kv_spec import qualify_variant
from ..blocks.registry import all_formats, display_name, get_format


class GgmlUnavailable(ImportError):
    """llama-cpp-python (and so ggml's C library) is not installed or cannot be loaded."""


class LlamaBuildError(RuntimeError):
    """A llama.cpp build cannot be used (one line says why)."""


@dataclass(frozen=True)
class BuildInfo:
    """What :func:`tqbridge.bridge.llama.build.describe` found; ``problems`` empty when tqbridge can
    use the build."""

    path: Path
    report: dict = field(compare=False)

    @property
    def problems(self) -> list[str]:
        return list(self.report.get("problems", []))

    @property
    def variant(self) -> "str | None":
        return (self.report.get("turbo") or {}).get("variant")

    @property
    def shim(self) -> Path:
        return Path(self.report["shim"])

    def label(self) -> str:
        commit = (self.report.get("commit") or "")[:9]
        kind = f"TurboQuant fork, {self.variant}" if self.variant else "no turbo types"
        return f"llama.cpp build {self.path} (ggml {self.report.get('ggml_version', '?')}, commit {commit or '?'}; {kind})"

    def one_line(self) -> str:
        return "; ".join(self.problems)


_selected: "BuildInfo | None" = None


# The environment llama.cpp reads, when it creates a context, for its Hadamard rotation of quantized KV
# caches (PR #21038): upstream rotates unless LLAMA_ATTN_ROT_DISABLE is set; the TurboQuant fork at 69d8e4b
# rotates only when asked per side (LLAMA_ATTN_ROT_K_OVERRIDE / _V_OVERRIDE), K in groups of 64 unless
# LLAMA_ATTN_ROT_K_NROT=0 asks for upstream's group (the largest power of two dividing the head dim);
# other builds ignore the names they do not read (src/llama-kv-cache.cpp of each tree).
ROTATION_ON = {"LLAMA_ATTN_ROT_DISABLE": None, "LLAMA_ATTN_ROT_K_OVERRIDE": "1",
               "LLAMA_ATTN_ROT_V_OVERRIDE": "1", "LLAMA_ATTN_ROT_K_NROT": "0"}
ROTATION_OFF = {"LLAMA_ATTN_ROT_DISABLE": "1", "LLAMA_ATTN_ROT_K_OVERRIDE": None,
                "LLAMA_ATTN_ROT_V_OVERRIDE": None, "LLAMA_ATTN_ROT_K_NROT": None}


def rotation_environ(rotation: bool):
    """``with rotation_environ(True):`` contexts created inside rotate quantized K/V rows as upstream
    llama.cpp does, in every build (the fork at 69d8e4b included); ``False``: no build rotates."""
    from ..environ import scoped_environ

    return scoped_environ(ROTATION_ON if rotation else ROTATION_OFF)


def selected() -> "BuildInfo | None":
    """The build this process uses as its llama.cpp side (None: llama-cpp-python's own)."""
    return _selected


def set_selected(info: BuildInfo) -> None:
    """Record ``info`` as this process's build, unchecked: :func:`tqbridge.bridge.llama.build.select`
    is the way in (it refuses a build with problems, and any build once a ggml library is loaded)."""
    global _selected
    _selected = info


# ---------------------------------------------------------------------------------------------
# the libraries


def _lib_names() -> list[str]:
    if sys.platform == "darwin":
        return ["libggml-base.dylib"]
    if sys.platform == "win32":
        return ["ggml-base.dll"]
    return ["libggml-base.so"]


def cpu_library_name() -> str:
    """File name of ggml's CPU backend library (beside ``libggml-base``)."""
    if sys.platform == "darwin":
        return "libggml-cpu.dylib"
    if sys.platform == "win32":
        return "ggml-cpu.dll"
    return "libggml-cpu.so"


def library_path() -> Path:
    """Path of the ``libggml-base`` of this process's llama.cpp side: the build chosen with
    :func:`tqbridge.bridge.llama.build.select`, else the one inside the installed llama-cpp-python;
    GgmlUnavailable if none."""
    build = selected()
    if build is not None:
        return Path(build.report["libraries"]["ggml-base"])

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise GgmlUnavailable(
            "ggml's C library is needed for this check but llama-cpp-python is not installed: "
            "pip install 'tqbridge[llama]'")
    for root in spec.submodule_search_locations:
        for name in _lib_names():
            p = Path(root) / "lib" / name
            if p.exists():
                return p
    raise GgmlUnavailable(f"llama-cpp-python is installed but has no {_lib_names()[0]} in its lib/ folder")


# ---------------------------------------------------------------------------------------------
# the type ids


def turbo_variants() -> dict[str, dict[str, Any]]:
    """Registry turbo variants the fork ships: ``{variant: {name: Format}}`` (tqbridge extensions left out)."""
    out: dict[str, dict[str, Any]] = {}
    for f in all_formats():
        if f.kind == "turbo" and not f.extension and f.type_ids:
            out.setdefault(f.variant, {})[f.name] = f
    return out


def fork_type_id(fmt) -> int:
    """The ggml type id a fork build gives turbo format ``fmt``."""
    return int(next(iter(fmt.type_ids.values())))


def type_table(variant: "str | None" = None) -> dict[int, Any]:
    """ggml type id -> registry Format: upstream's ids of the legacy and float types, plus the turbo
    types of ``variant`` (default: the selected build's variant, if it is a fork)."""
    table = {f.type_ids["ggml"]: f for f in all_formats() if "ggml" in f.type_ids}
    info = selected()
    variant = variant or (info.variant if info is not None else None)
    if variant:
        known = turbo_variants()
        if variant not in known:
            raise LlamaBuildError(f"no turbo variant {variant!r}; known: {', '.join(known)}")
        for f in known[variant].values():
            table[fork_type_id(f)] = f
    return table


def kv_types() -> dict[str, int]:
    """Registry name (as users type it) -> ggml type id, of every KV cache type the active side takes."""
    out = {}
    for tid, f in type_table().items():
        if f.llama_kv or f.kind == "turbo":
            out[display_name(f)] = tid
            out[f.key] = tid
    return out


def kv_type_id(name: str) -> int:
    """The ggml type id the active llama.cpp side gives KV cache format ``name`` (a bare turbo name
    means the selected fork build's variant)."""
    table = kv_types()
    key = str(name).strip().lower()
    if key not in table:
        info = selected()
        qualified = qualify_variant(key, info.variant if info is not None else None)
        if qualified != key:
            key = qualified
        else:
            try:
                key = get_format(key).key
            except FormatError:
                pass
    if key not in table:
        raise LlamaBuildError(f"this llama.cpp has no KV cache type {name!r} (has: {', '.join(sorted(table))})")
    return table[key]
