"""mlx-lm's OpenAI-compatible server (``mlx_lm.server``) with TQCache layers: ``tqbridge serve``.

mlx-lm's server has no option for a cache class. Every cache it makes comes from ``make_prompt_cache``,
which calls ``model.make_cache()`` where the model has one: :func:`~tqbridge.metal.lm.cache.install_cache`
sets that on the loaded model. The server's ``main()`` builds its model provider and its response
generator from its module's ``ModelProvider`` and ``ResponseGenerator``; :func:`run_server` binds those
two names to subclasses for the duration of the run:

- :class:`TQModelProvider` installs the TQCache layers on every model it loads and recomputes the
  server's ``is_batchable`` from the caches the model now makes: concurrent requests share decode
  steps in mlx-lm's ``BatchGenerator`` (``TQCache.merge`` makes a
  :class:`~tqbridge.metal.lm.cache.BatchTQCache`), except with key calibration (each sequence fits its
  own), which serves one request at a time. Prompt-cache reuse (``LRUPromptCache``) works on both
  paths; the server's ``BatchGenerator`` is bound to a subclass that logs each new largest batch.
- :class:`RoutedResponseGenerator` runs the server's generation thread inside
  :func:`~tqbridge.metal.lm.routing.route_attention` (decode steps of TQCache layers to the fused
  kernel on a GPU), after loading the default model so that its modules are routed.

Models: a directory mlx-lm loads (``tqbridge convert MODEL.gguf --to mlx DIR`` writes one), or a GGUF
(path or bundled name), converted once into tqbridge's cache directory (:func:`model_dir`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

__all__ = ["ServeError", "model_dir", "check_server_args", "check_address", "check_layers", "run_server", "REFUSED_OPTIONS"]

# mlx-lm server options tqbridge serve takes otherwise, or refuses with TQCache layers (and why)
REFUSED_OPTIONS = {
    "--model": "give the model as tqbridge serve's MODEL argument",
    "--kv-bits": "quantizes mlx-lm's own caches, which tqbridge serve replaces: choose the pair with --kv",
    "--kv-group-size": "belongs to --kv-bits: choose the pair with --kv",
    "--quantized-kv-start": "belongs to --kv-bits: choose the pair with --kv",
}


class ServeError(ValueError):
    """A model or option tqbridge serve cannot take; one line says why."""


def check_server_args(args: "list[str]") -> None:
    """Refuse the mlx-lm server options that tqbridge serve replaces (:data:`REFUSED_OPTIONS`)."""
    for a in args:
        name = a.split("=", 1)[0]
        if name in REFUSED_OPTIONS:
            raise ServeError(f"{name}: {REFUSED_OPTIONS[name]}")


def check_address(server_args: "list[str]") -> "tuple[str, int]":
    """The ``--host`` / ``--port`` mlx-lm's server will take from ``server_args`` (its defaults:
    127.0.0.1, 8080), refused in one line when nothing can listen there now (a port in use, a host that
    is not this machine's). mlx-lm's server would start its generation thread first and then hang on
    the traceback of its bind."""
    import argparse
    import socket

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", default="8080")
    known, _ = p.parse_known_args(server_args)
    try:
        port = int(known.port)
    except ValueError:
        raise ServeError(f"--port: not a port number: {known.port!r}") from None
    if not 0 <= port <= 65535:
        raise ServeError(f"--port: {port} is not a port number (0..65535)")
    try:
        family, kind, _, _, addr = socket.getaddrinfo(known.host, port, type=socket.SOCK_STREAM,
                                                      flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as Python's HTTP server binds
            sock.bind(addr)
    except OSError as e:
        raise ServeError(f"cannot listen on {known.host}:{port}: {e.strerror or e}") from None
    return known.host, port


def model_dir(model: str) -> Path:
    """The mlx-lm model directory to serve for ``model``: a directory as it is (it must hold mlx-lm's
    config.json and tokenizer files), or a GGUF path / bundled model name converted once by
    :func:`tqbridge.bridge.gguf.mlx_export.write_mlx_dir` into ``<tqbridge cache>/mlx-models/`` (keyed by
    the GGUF's path, size and modification time)."""
    from tqbridge.bridge.environ import cache_dir
    from tqbridge.bridge.gguf.model import GGUFModelError
    from tqbridge.bridge.gguf.mlx_export import write_mlx_dir
    from tqbridge.bridge.gguf.models import ModelUnavailable, model_path

    p = Path(model)
    if p.is_dir():
        return _checked_dir(p)
    try:
        src = Path(model_path(model)).resolve()
    except (ModelUnavailable, FileNotFoundError) as e:
        raise ServeError(str(e)) from None
    st = src.stat()
    key = hashlib.sha256(f"{src}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    out = cache_dir() / "mlx-models" / f"{src.stem}-{key}"
    if not (out / "config.json").is_file():
        print(f"converting {src.name} to an mlx-lm directory (once): {out}", file=sys.stderr)
        try:
            write_mlx_dir(src, out, quantize=True)
        except GGUFModelError as e:
            if not (out / "config.json").is_file():   # not another process converting the same GGUF
                raise ServeError(str(e)) from None
    return _checked_dir(out)


def check_layers(directory: "str | os.PathLike[str]", kv) -> None:
    """Refuse per-layer indices of ``kv`` (a LayeredKV) that the model in ``directory`` does not have,
    before the server starts (its ``num_hidden_layers``; the load checks again against the caches the
    model makes)."""
    from tqbridge.bridge import FormatError

    try:
        cfg = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return
    n = cfg.get("num_hidden_layers", (cfg.get("text_config") or {}).get("num_hidden_layers"))
    if isinstance(n, int) and not isinstance(n, bool) and n > 0:
        try:
            kv.pairs(n)
        except FormatError as e:
            raise ServeError(str(e)) from None


def _checked_dir(p: Path) -> Path:
    cfg = p / "config.json"
    if not cfg.is_file():
        raise ServeError(f"{p}: not an mlx-lm model directory (no config.json)")
    if not (p / "tokenizer.json").is_file() and not (p / "tokenizer.model").is_file():
        try:
            note = json.loads(cfg.read_text()).get("tqbridge", {}).get("tokenizer_note")
        except (OSError, ValueError, AttributeError):
            note = None
        raise ServeError(f"{p}: no tokenizer files, which mlx-lm's server needs" + (f" ({note})" if note else ""))
    return p


def run_server(directory: "str | os.PathLike[str]", kv, server_args: "list[str]", *, sliding: str = "quantize",
               rotation: str = "llama", decode: str = "auto", prog: str = "tqbridge serve") -> None:
    """Run mlx-lm's server (its ``main()``, parsing ``server_args`` as its own options) on the model in
    ``directory`` with TQCache layers of ``kv`` (a LayeredKV or its spelling) and the attention routing
    in ``decode`` mode. Returns when the server stops."""
    check_server_args(server_args)
    from mlx_lm import server

    from .cache import install_cache
    from .routing import route_attention

    base_provider, base_generator = server.ModelProvider, server.ResponseGenerator

    class TQModelProvider(base_provider):
        """mlx-lm's model provider; every model it loads makes TQCache layers."""

        def _load(self, *args, **kwargs):
            super()._load(*args, **kwargs)
            install_cache(self.model, kv, sliding=sliding, rotation=rotation)
            # the server's own rule (every cache can merge into a batch), on the caches made now;
            # calibrated keys do not batch (each sequence fits its own calibration)
            self.is_batchable = self.is_batchable and all(
                hasattr(c, "merge") and not getattr(c, "calibration", None)
                for c in server.make_prompt_cache(self.model))

    base_batch = server.BatchGenerator

    class LoggedBatchGenerator(base_batch):
        """mlx-lm's batch generator; logs each new largest number of sequences decoded in one step."""

        largest = 1

        def _next(self):
            out = super()._next()
            n = len(self._generation_batch)
            if n > self.largest:
                self.largest = n
                server.logging.info(f"tqbridge serve: {n} sequences decode in one batch")
            return out

    made = []

    class RoutedResponseGenerator(base_generator):
        """mlx-lm's response generator; its generation thread runs in the attention routing."""

        def __init__(self, *args, **kwargs):
            made.append(self)
            super().__init__(*args, **kwargs)

        def _run_generate(self):
            try:
                self.model_provider.load_default()   # its modules loaded before the routing patches them
            except Exception:   # the server's own loading reports it to the first request
                pass
            with route_attention(decode):
                super()._run_generate()

    argv = sys.argv
    sys.argv = [prog, "--model", os.fspath(directory), *server_args]
    server.ModelProvider, server.ResponseGenerator = TQModelProvider, RoutedResponseGenerator
    server.BatchGenerator = LoggedBatchGenerator
    try:
        server.main()
    except OSError as e:   # its HTTP server could not bind after all (taken since check_address)
        raise ServeError(f"mlx-lm's server cannot listen: {e.strerror or e}") from None
    finally:
        for g in made:     # its generation thread ends with the server, whatever ended it
            g.stop_and_join()
        server.ModelProvider, server.ResponseGenerator = base_provider, base_generator
        server.BatchGenerator = base_batch
        sys.argv = argv
