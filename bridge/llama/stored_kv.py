"""What a llama.cpp build stores in its KV cache, per layer, against what was asked for.

A context is created with one K type and one V type, but a build may store other types, per layer.
The TurboQuant fork at 69d8e4b (``TheTom/llama-cpp-turboquant``, ``src/llama-kv-cache.cpp``, the
``llama_kv_cache`` constructor) has two such rules; the fork-pr197 tree has neither:

- **auto-asymmetric K** (``TURBO_AUTO_ASYMMETRIC``; off when the variable starts with ``0``): when K is
  a turbo type, K and V are the same type, and ``n_head / n_head_kv >= 6`` (integer division, layer 0's
  counts), K is stored as q8_0 in every layer. A warning line in the log says so.
- **layer-adaptive types** (``TURBO_LAYER_ADAPTIVE=N``; ``0`` off): 1 = q8_0 K and V in the first and
  last 4 layers (turbo K, >= 8 layers); 2 = q8_0 K and V in the last 8 (turbo K, >= 8 layers);
  5 = V turbo4 in the first 2 and last 2 layers, turbo2 elsewhere; 6 = V turbo4 in the last 8, turbo2
  elsewhere; 7 = V q8_0 in the first 2 and last 2, turbo2 elsewhere (5-7: turbo V, >= 8 layers). Unset,
  mode 7 switches on by itself when V is turbo2 and the model has 8 or more layers. The mode is decided
  once per process, at the first KV cache the process creates (a function-local ``static``): a process
  whose first cache had a turbo2 V applies mode 7 to every later turbo-V cache, turbo3 and turbo4
  included. The auto-asymmetric rule runs first, so the layer-adaptive rule sees its K.

Because of that process history, what a context stores is read from the context itself
(:func:`stored_pairs` on its state blob, or the flash-attention node's cache tensors); :func:`predict`
gives what a fresh process stores and :func:`explain` names the rules that account for a difference.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from ..blocks.kv_spec import LayeredKV, layered_kv_name, split_kv
from ..blocks.registry import display_name, get_format

# The fork's switches; "0" turns each rule off. Read by the fork when a context is created (the
# layer-adaptive one only at the process's first KV cache): set them before any context exists.
AUTO_ASYMMETRIC_ENV = "TURBO_AUTO_ASYMMETRIC"
LAYER_ADAPTIVE_ENV = "TURBO_LAYER_ADAPTIVE"
FORK_RULES_OFF = {AUTO_ASYMMETRIC_ENV: "0", LAYER_ADAPTIVE_ENV: "0"}
# Variants whose sources have the rules (registry turbo variants)
VARIANTS_WITH_RULES = ("fork-69d8e4b",)
AUTO_ASYMMETRIC_RATIO = 6      # n_head / n_head_kv at or above which K becomes q8_0
LAYER_ADAPTIVE_MIN_LAYERS = 8  # the layer-adaptive modes act on models with at least this many layers
AUTO_LAYER_ADAPTIVE_MODE = 7   # the mode a turbo2 V switches on by itself

# log lines of the fork that announce a type change (matched as substrings)
RULE_LOG_MARKERS = ("auto-asymmetric", "layer-adaptive mode", "Boundary V", "V-only LA mode")


def switch_off_fork_rules(environ=None) -> dict:
    """Set the fork's switches to off in ``environ`` (default: this process's environment, so a
    library loaded later reads them); returns the previous values."""
    env = os.environ if environ is None else environ
    before = {k: env.get(k) for k in FORK_RULES_OFF}
    env.update(FORK_RULES_OFF)
    return before


def fork_rules_off(environ=None) -> bool:
    """True when both switches say off in ``environ`` (default: this process's environment)."""
    env = os.environ if environ is None else environ
    return all(str(env.get(k, "")).startswith("0") for k in FORK_RULES_OFF)


def _name(fmt) -> str:
    return display_name(get_format(fmt) if isinstance(fmt, str) else fmt)


def _key(fmt) -> str:
    return (get_format(fmt) if isinstance(fmt, str) else fmt).key


def stored_pairs(state, swa: "list[bool] | None" = None) -> "list[tuple[str, str]]":
    """``(K, V)`` format names (as users type them) of every model layer, from a parsed state blob
    (:func:`tqbridge.bridge.llama.state.parse_state`; it must hold at least one cell: an empty cache
    writes no layers). ``swa`` as :meth:`LlamaState.model_layers`."""
    layers = state.model_layers(swa)
    return [(_name(L.k_format), _name(L.v_format)) for _, L in sorted(layers.items())]


def layered_spelling(pairs: "list[tuple[str, str]]") -> str:
    """Per-layer pairs in the per-layer spelling (:func:`.kv_spec.layered_kv_name`): the most common
    pair as the default, every other pair as a ``[LAYERS=K/V]`` group. One pair for every layer: that
    pair's spelling, ``K`` alone when K and V agree."""
    if not pairs:
        raise ValueError("no layers")
    counts = Counter(pairs)
    default = max(counts, key=lambda p: (counts[p], -pairs.index(p)))
    groups = tuple((_ranges([i for i, p in enumerate(pairs) if p == pair]), pair)
                   for pair in sorted((p for p in counts if p != default), key=pairs.index))
    return layered_kv_name(LayeredKV(default, groups), short=True)


def _ranges(idx: "list[int]") -> "tuple[tuple[int, int], ...]":
    """Sorted layer indices as ``(first, last)`` runs."""
    out, start = [], idx[0]
    for a, b in zip(idx, idx[1:] + [None]):
        if b != a + 1:
            out.append((start, a))
            start = b
    return tuple(out)


def _turbo(fmt: str) -> bool:
    return get_format(fmt).kind == "turbo"


def _with_variant(base: str, like: str) -> str:
    """``turbo4`` in the variant of format ``like`` (a turbo format), as a name."""
    return _name(f"{base}@{get_format(like).variant}")


def predict(k: str, v: str, *, n_head: int, n_head_kv: int, n_layer: int, variant: "str | None",
            environ=None, first_v: "str | None" = None) -> "list[tuple[str, str]]":
    """The ``(K, V)`` names a fresh process of a fork build of ``variant`` stores per layer when asked
    for ``k``/``v`` on a model with these head counts (layer 0's) and ``n_layer`` layers, with the
    switches in ``environ`` (default: this process's). ``first_v``: the V type of the process's first
    KV cache (default ``v``), which decides the layer-adaptive mode."""
    env = os.environ if environ is None else environ
    k, v = _name(k), _name(v)
    pairs = [(k, v)] * n_layer
    if variant not in VARIANTS_WITH_RULES:
        return pairs
    q8 = "q8_0"
    if _turbo(k) and not str(env.get(AUTO_ASYMMETRIC_ENV, "")).startswith("0"):
        if n_head_kv > 0 and n_head // n_head_kv >= AUTO_ASYMMETRIC_RATIO and _key(k) == _key(v):
            k = q8
    raw = env.get(LAYER_ADAPTIVE_ENV)
    first_v = _name(first_v) if first_v is not None else v
    if raw is not None:
        try:
            mode = int(raw)
        except ValueError:   # the fork's atoi: no leading number reads as 0
            mode = 0
    elif _turbo(first_v) and get_format(first_v).name == "turbo2" and n_layer >= LAYER_ADAPTIVE_MIN_LAYERS:
        mode = AUTO_LAYER_ADAPTIVE_MODE
    else:
        mode = 0
    out = []
    for il in range(n_layer):
        lk, lv = k, v
        if n_layer >= LAYER_ADAPTIVE_MIN_LAYERS:
            edge4 = il < 4 or il >= n_layer - 4
            edge2 = il < 2 or il >= n_layer - 2
            last8 = il >= n_layer - 8
            if mode == 1 and _turbo(k) and edge4:
                lk = lv = q8
            elif mode == 2 and _turbo(k) and last8:
                lk = lv = q8
            elif mode == 5 and _turbo(v):
                lv = _with_variant("turbo4" if edge2 else "turbo2", v)
            elif mode == 6 and _turbo(v):
                lv = _with_variant("turbo4" if last8 else "turbo2", v)
            elif mode == 7 and _turbo(v):
                lv = q8 if edge2 else _with_variant("turbo2", v)
        out.append((lk, lv))
    return out


def explain(k: str, v: str, pairs: "list[tuple[str, str]]", *, n_head: int, n_head_kv: int,
            variant: "str | None", environ=None) -> "list[str]":
    """One line per rule of the fork that turns the ``k``/``v`` request into the stored ``pairs``
    (empty when nothing changed). A change no rule of a fresh process accounts for is named as such
    (e.g. the layer-adaptive mode a turbo2 V cache earlier in the same process switched on)."""
    k, v = _name(k), _name(v)
    if all(p == (k, v) for p in pairs):
        return []
    n = len(pairs)
    env = os.environ if environ is None else environ
    out = []
    ratio = n_head // n_head_kv if n_head_kv else 0
    if all(p[0] == "q8_0" for p in pairs) and k != "q8_0" and _turbo(k) and _key(k) == _key(v) \
            and ratio >= AUTO_ASYMMETRIC_RATIO:
        out.append(f"{AUTO_ASYMMETRIC_ENV}: {n_head}/{n_head_kv} query/KV heads (ratio {ratio} >= "
                   f"{AUTO_ASYMMETRIC_RATIO}) and K = V = {k}: K stored as q8_0 in every layer "
                   f"({AUTO_ASYMMETRIC_ENV}=0 turns it off)")
        k = "q8_0"
    changed_v = [i for i, p in enumerate(pairs) if p[1] != v]
    changed_k = [i for i, p in enumerate(pairs) if p[0] != k]
    if changed_v or changed_k:
        for mode in (1, 2, 5, 6, 7):
            want = predict(k, v, n_head=1, n_head_kv=1, n_layer=n, variant=variant,
                           environ={AUTO_ASYMMETRIC_ENV: "0", LAYER_ADAPTIVE_ENV: str(mode)})
            if want == list(pairs):
                auto = env.get(LAYER_ADAPTIVE_ENV) is None and mode == AUTO_LAYER_ADAPTIVE_MODE
                why = ("switched on by itself for a turbo2 V cache"
                       + ("" if get_format(v).name == "turbo2" else " earlier in this process (the mode is decided "
                          "once per process)") if auto else f"{LAYER_ADAPTIVE_ENV}={env.get(LAYER_ADAPTIVE_ENV)}")
                out.append(f"{LAYER_ADAPTIVE_ENV} mode {mode} ({why}): stored {layered_spelling(list(pairs))} "
                           f"({LAYER_ADAPTIVE_ENV}=0 turns it off)")
                break
        else:
            out.append(f"no rule of the fork accounts for it: stored {layered_spelling(list(pairs))}")
    return out


@dataclass(frozen=True)
class StoredKV:
    """A request and what the build stored for it, per layer, with the rules that explain it."""

    requested: str                       # the K/V pair's spelling as asked
    pairs: tuple                         # ((K, V), ...) per model layer, as stored
    rules: tuple = ()                    # lines from :func:`explain`

    @property
    def changed(self) -> bool:
        return bool(self.rules)

    @property
    def spelling(self) -> str:
        return layered_spelling(list(self.pairs))

    def to_json(self) -> dict:
        return {"requested": self.requested, "stored": self.spelling, "changed": self.changed,
                "rules": list(self.rules), "layers": [list(p) for p in self.pairs]}


def model_heads(gguf_path) -> "tuple[int, int, int]":
    """``(n_head, n_head_kv, n_layer)`` of a GGUF file (layer 0's head counts where they are per layer)."""
    from ..gguf.io import read_values

    arch = read_values(gguf_path, ["general.architecture"]).get("general.architecture")
    keys = [f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv", f"{arch}.block_count"]
    meta = read_values(gguf_path, keys)

    def first(key, default=None):
        x = meta.get(f"{arch}.{key}", default)
        if x is None:
            raise ValueError(f"{gguf_path}: no {arch}.{key} in its metadata")
        return int(x[0]) if hasattr(x, "__len__") else int(x)

    n_head = first("attention.head_count")
    return n_head, first("attention.head_count_kv", n_head), first("block_count")


def read_stored(state, requested: str, gguf_path=None, *, heads: "tuple[int, int] | None" = None,
                swa: "list[bool] | None" = None, variant: "str | None" = None) -> StoredKV:
    """What a llama.cpp build stored for the K/V pair ``requested`` (``K/V`` or one name), read from
    its state blob (bytes or a parsed state) after a context of that request evaluated at least one
    token; the rules of the fork that explain a difference, from the model's ``(n_head, n_head_kv)``
    (``heads``, else read from ``gguf_path``). ``variant``: the build's turbo variant (default: the
    selected build's)."""
    from .side import selected
    from .state import parse_state

    if isinstance(state, (bytes, bytearray, memoryview)):
        state = parse_state(state)
    pairs = stored_pairs(state, swa)
    k, v = split_kv(str(requested))
    if variant is None:
        info = selected()
        variant = info.variant if info is not None else None
    n_head, n_head_kv = heads if heads is not None else model_heads(gguf_path)[:2]
    rules = explain(k, v, pairs, n_head=n_head, n_head_kv=n_head_kv, variant=variant)
    return StoredKV(requested=str(requested), pairs=tuple(pairs), rules=tuple(rules))
