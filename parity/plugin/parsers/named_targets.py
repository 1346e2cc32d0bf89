"""The built-in parser targets by name, and a campaign's target (a built-in name, or ``module:attr``
naming a :class:`~.target.ParserTarget` of the caller's) resolved to a target object."""

from __future__ import annotations

import os
import sys

from .gguf_target import GGUFTarget
from .kv_spelling_target import KVSpellingTarget
from .prompt_cache_target import PromptCacheTarget
from .state_blob_target import StateBlobTarget
from .target import ParserFuzzError, ParserTarget

PARSER_TARGETS = ("gguf", "state-blob", "prompt-cache", "kv-spelling")


def make_target(name: str, **kw) -> ParserTarget:
    if name == "gguf":
        return GGUFTarget()
    if name == "state-blob":
        return StateBlobTarget(**kw)
    if name == "prompt-cache":
        return PromptCacheTarget()
    if name == "kv-spelling":
        return KVSpellingTarget()
    raise ParserFuzzError(f"unknown parser target {name!r}: use one of {', '.join(PARSER_TARGETS)}")


def resolve_target(spec: dict) -> ParserTarget:
    """The target a campaign's ``spec`` names (``spec["target"]``; ``spec["real_seeds"]`` for state blobs)."""
    name = spec["target"]
    if ":" in name:     # module:attr, a ParserTarget (instance or class) of the caller's
        import importlib

        mod, _, attr = name.partition(":")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            obj = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            raise ParserFuzzError(f"parser target {name!r}: {e}") from None
        obj = obj() if isinstance(obj, type) else obj
        if not isinstance(obj, ParserTarget):
            raise ParserFuzzError(f"parser target {name!r} is not a tqbridge.parity.plugin.parsers.target.ParserTarget")
        return obj
    if name == "state-blob":
        return make_target("state-blob", real=spec.get("real_seeds", True))
    return make_target(name)
