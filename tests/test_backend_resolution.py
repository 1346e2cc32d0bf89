"""Which backend each public entry point picks, on every combination of what a machine has.

Two entry points with different contracts, both pinned here (issue 16, item 2: one module owns GPU
detection and backend resolution; these answers must not move):

- ``tqbridge.metal.backends()`` / ``resolve()`` (kernels built through ``build``): every usable
  backend, best first; a GPU that is not MLX's default device still counts, after the emulator, so
  with no C++ compiler ``"auto"`` takes that GPU. Explicit names are checked.
- ``attention_kernel.pick_backend()`` (the fused attention): ``"auto"`` is the GPU only while MLX's
  default device is that GPU, else the CPU emulator, whether or not a compiler exists (the emulator
  then says there is none when it builds). Explicit kernel backends pass through unchecked.

The machine is faked at its edges: MLX's ``metal`` / ``cuda`` availability and default device, and
the emulator's compiler lookup.
"""

from __future__ import annotations

import sys

import pytest

mx = pytest.importorskip("mlx.core")

from tqbridge.metal import backends, emulator, resolve  # noqa: E402
from tqbridge.metal.attention import kernel as attention_kernel
from tqbridge.metal.emulator import EmulatorError  # noqa: E402
from tqbridge.metal.kernel import KernelError  # noqa: E402


def _forget_detection():
    """Drop any cached answer of GPU detection, wherever a module keeps one."""
    for name, mod in list(sys.modules.items()):
        if name.startswith("tqbridge.metal"):
            for attr in ("_gpu_kind", "gpu_kind"):
                fn = getattr(mod, attr, None)
                if hasattr(fn, "cache_clear"):
                    fn.cache_clear()


@pytest.fixture
def machine(monkeypatch):
    """``machine(gpu, gpu_default, compiler)`` fakes a machine: gpu is None, "metal" or "cuda"."""

    def fake(gpu, gpu_default, compiler):
        monkeypatch.setattr(mx.metal, "is_available", lambda: gpu == "metal")
        monkeypatch.setattr(mx.cuda, "is_available", lambda: gpu == "cuda")
        monkeypatch.setattr(mx, "default_device", lambda: mx.gpu if gpu_default else mx.cpu)

        def find_compiler():
            if not compiler:
                raise EmulatorError("no C++ compiler found (faked)")
            return "c++"

        monkeypatch.setattr(emulator, "find_compiler", find_compiler)
        _forget_detection()

    yield fake
    monkeypatch.undo()
    _forget_detection()


E, R = "cpu-emulator", "reference"
# (gpu, MLX default device is the GPU, C++ compiler) -> backends(), pick_backend("auto")
TABLE = [
    (None, False, True, [E, R], E),
    (None, False, False, [R], E),
    (None, True, True, [E, R], E),
    (None, True, False, [R], E),
    ("metal", True, True, ["metal", E, R], "metal"),
    ("metal", True, False, ["metal", R], "metal"),
    ("metal", False, True, [E, "metal", R], E),
    ("metal", False, False, ["metal", R], E),       # the two contracts differ here
    ("cuda", True, True, ["cuda", E, R], "cuda"),
    ("cuda", True, False, ["cuda", R], "cuda"),
    ("cuda", False, True, [E, "cuda", R], E),
    ("cuda", False, False, ["cuda", R], E),
]


@pytest.mark.parametrize("gpu, default, compiler, usable, attention_auto", TABLE)
def test_auto_on_every_machine(machine, gpu, default, compiler, usable, attention_auto):
    machine(gpu, default, compiler)
    assert backends() == usable
    assert resolve() == resolve("auto") == usable[0]
    assert attention_kernel.pick_backend("auto") == attention_auto
    # names pick_backend does not take as a kernel backend mean "auto" to it
    assert attention_kernel.pick_backend("reference") == attention_auto
    assert attention_kernel.pick_backend("kernel") == attention_auto


@pytest.mark.parametrize("gpu", [None, "metal", "cuda"])
@pytest.mark.parametrize("compiler", [True, False])
def test_explicit_names(machine, gpu, compiler):
    machine(gpu, True, compiler)
    for name in ("metal", "cuda"):
        assert attention_kernel.pick_backend(name) == name          # passed through, unchecked
        if name == gpu:
            assert resolve(name) == name
        else:
            with pytest.raises(KernelError, match="not available here"):
                resolve(name)
    assert attention_kernel.pick_backend(E) == E
    if compiler:
        assert resolve(E) == E
    else:
        with pytest.raises(EmulatorError, match="no C\\+\\+ compiler"):
            resolve(E)
    assert resolve(R) == R
    with pytest.raises(KernelError, match="unknown backend 'vulkan'"):
        resolve("vulkan")


def test_detection_survives_a_failing_probe(machine, monkeypatch):
    """An MLX build whose Metal probe raises is a machine without Metal for backends()."""
    machine(None, True, True)

    def broken():
        raise RuntimeError("probe failed")

    monkeypatch.setattr(mx.metal, "is_available", broken)
    _forget_detection()
    assert backends() == [E, R]


# ---------------------------------------------------------------- the decode lane's test switch

@pytest.mark.parametrize("emulated", [False, True])
@pytest.mark.parametrize("gpu, default", [(None, False), ("cuda", True), ("cuda", False)])
def test_decode_lane_switch(machine, emulated, gpu, default):
    """Inside emulate_decode_lane() the GPU decode lane goes to the emulator on MLX's CPU device; on the
    GPU device the GPU's lane runs either way; the setting is gone after the block."""
    from tqbridge.metal import backend
    from tqbridge.metal.lm import cache as cache_mod
    from tqbridge.metal import codecs

    machine(gpu, default, True)
    with backend.emulate_decode_lane(emulated):
        assert backend.emulated_decode_lane() is emulated
        assert codecs.gpu_backend() == ("cuda" if default else "cpu-emulator" if emulated else None)
        assert cache_mod._decode_backend("auto") == ("auto" if default or emulated else "reference")
    assert backend.emulated_decode_lane() is False
