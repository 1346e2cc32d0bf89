"""Test configuration: hypothesis profiles and markers.

Profiles (one set, parity/plugin/profiles.py; select with ``TQBRIDGE_PROFILE=<name>`` or pytest's
``--hypothesis-profile=<name>``):

- ``ci``   derandomized and bounded: what CI (2 cores, no GPU) runs; the default.
- ``dev``  random seeds, a few more examples, for local work.
- ``deep`` long fuzz campaigns (thousands of examples per property).

hypothesis' files (example database, caches) go to ``$TQBRIDGE_CACHE/hypothesis`` (default
``~/.cache/tqbridge/hypothesis``), not ``.hypothesis/`` in the current directory, unless
``HYPOTHESIS_STORAGE_DIRECTORY`` is set.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

from tqbridge.bridge.mlx_blas import prefer_fast_blas

# Before any test module imports MLX: decides which BLAS the whole run gets (see bridge/mlx_blas.py).
_BLAS = prefer_fast_blas()

from tqbridge.bridge.environ import cache_dir  # noqa: E402 - after the BLAS choice

if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
    set_hypothesis_home_dir(cache_dir() / "hypothesis")   # this process only; subprocesses choose their own

from tqbridge.parity.plugin.profiles import register as register_profiles  # noqa: E402

register_profiles(prefix="")   # the plugin's profile set (parity/plugin/profiles.py) under the bare names
settings.load_profile(os.environ.get("TQBRIDGE_PROFILE", "ci"))


def pytest_report_header(config):
    return f"tqbridge hypothesis profile: {settings._current_profile}; MLX BLAS: {_BLAS}"


@pytest.fixture
def emulated_decode_lane():
    """The GPU decode lane with its kernels on the CPU emulator for the test (on MLX's CPU device)."""
    from tqbridge.metal.backend import emulate_decode_lane

    with emulate_decode_lane():
        yield


@pytest.fixture
def folded_steps(monkeypatch):
    """The emulated decode lane's offers to fold a step's append into pass 1 (``fold_append``), in order: True
    where the step ran folded, False where the plan refused and the append kernel ran."""
    from tqbridge.metal.attention import kernel as attention_kernel

    seen = []
    real = attention_kernel._EmulatedDecodeLaunch._folded

    def spy(self, *a, **kw):
        got = real(self, *a, **kw)
        seen.append(not isinstance(got, str))   # a string: why the plan refused
        return got

    monkeypatch.setattr(attention_kernel._EmulatedDecodeLaunch, "_folded", spy)
    return seen


@pytest.fixture
def gpu_device():
    """MLX's GPU as the default device for the test that asks (also where a module's autouse fixture made it
    the CPU); skipped, with the reason, where MLX has no GPU backend."""
    import mlx.core as mx

    if not mx.is_available(mx.gpu):
        pytest.skip("no MLX GPU backend (Metal or CUDA) here")
    prev = mx.default_device()
    mx.set_default_device(mx.gpu)
    yield
    mx.set_default_device(prev)


@pytest.fixture
def cpu_device():
    """MLX's CPU device for the test that asks (its GPU tests keep the default device); a module that
    imports tiny_models' fixture of this name has it for every test instead."""
    import mlx.core as mx

    prev = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(prev)
