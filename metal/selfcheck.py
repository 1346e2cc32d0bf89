"""A one-time self-check of the GPU decode lane's kernels on hardware they meet for the first time.

Before a TQCache layer first writes with the in-place append kernel and reads with the fused
attention on a GPU backend, both run on a small problem here and are compared with their references
(the append's bytes with :func:`tqbridge.metal.kv_append.reference_append`, byte for byte; the
attention with ``decode_attention(..., backend="reference")`` within ``ATTENTION_TOLERANCE``). The
verdict is cached per (backend, device, kernel sources, formats, geometry, dtype), in this process and
on disk (``$TQBRIDGE_CACHE/selfcheck.json``), so it costs one small run per machine and kernel
revision. A mismatch or a build error makes the cache take the reference paths — loudly: one line on
stderr per configuration, and the reason in ``cache.decode_fallback`` (which every report shows).
Metal has never been run by this project's CI; this is what protects a Mac user from it. On CUDA the
same check runs and passes (tests).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from functools import lru_cache

import numpy as np

from .decode_options import DEFAULT_OPTIONS, DecodeOptions
from .kernel import KERNEL_DIR

# fp16 / bf16 q and output through the kernel vs the float32 MLX-ops reference: output rounding
# (2^-8 for bf16) plus accumulation order; relative to the largest |output|.
ATTENTION_TOLERANCE = 1e-2
_RESULTS: dict = {}


@lru_cache(maxsize=1)
def kernel_digest() -> str:
    """A hash of every kernel source the decode lane compiles."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(KERNEL_DIR)):
        if name.endswith((".h", ".cpp")):
            h.update(name.encode() + (KERNEL_DIR / name).read_bytes())
    return h.hexdigest()[:16]


def _disk_path():
    from .emulator import cache_dir

    return cache_dir().parent / "selfcheck.json"


def _device_name(backend: str) -> str:
    try:
        import mlx.core as mx

        info = mx.device_info() if hasattr(mx, "device_info") else {}
        return str(info.get("device_name") or info.get("architecture") or backend)
    except Exception:   # pragma: no cover - depends on the MLX build
        return backend


def check_decode_lane(k_format: str, v_format: str, k_dim: int, v_dim: int, k_dp: int, v_dp: int,
                      k_rot: int, v_rot: int, dtype: str, backend: str,
                      options: "DecodeOptions | None" = None, calibrated: bool = False) -> "str | None":
    """None when the lane's kernels, launched with ``options``, reproduce their references here, else the
    reason (said once). ``calibrated``: the append that stores calibrated keys (random means and scales)
    and the attention whose pass 1 multiplies q by the scales."""
    opts = (DEFAULT_OPTIONS if options is None else options).resolve(backend)
    key = "|".join(map(str, (backend, _device_name(backend), kernel_digest(), k_format, v_format, k_dim,
                             v_dim, k_rot, v_rot, dtype, opts.label()) + (("calibrated",) if calibrated else ())))
    if key in _RESULTS:
        return _RESULTS[key]
    disk = {}
    try:
        disk = json.loads(_disk_path().read_text())
    except (OSError, ValueError):
        pass
    if key in disk and backend != "cpu-emulator":
        _RESULTS[key] = disk[key]
        return disk[key]
    raised = False
    try:
        reason = _run(k_format, v_format, k_dim, v_dim, k_dp, v_dp, k_rot, v_rot, dtype, backend, opts, calibrated)
    except Exception as e:   # a build or launch error is a failed check, not a crash
        reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        raised = True
    _RESULTS[key] = reason
    if reason:
        print(f"tqbridge: the {backend} decode kernels failed their self-check for {k_format}/{v_format} "
              f"({reason}); this cache takes the reference paths", file=sys.stderr)
    # kept on disk: the verdicts of kernels that ran (keyed by the kernel sources' digest); an error
    # raised on the way (a launch-code bug, a build failure) is this process's only, since a fix of the
    # Python around the kernels leaves the digest as it was
    if backend != "cpu-emulator" and not raised:
        try:
            from ..bridge.atomic import write_atomic

            disk[key] = reason
            write_atomic(_disk_path(), json.dumps(disk, indent=1))
        except OSError:   # a read-only cache folder: the check runs again next time
            pass
    return reason


def _run(k_format, v_format, k_dim, v_dim, k_dp, v_dp, k_rot, v_rot, dtype, backend, opts,
         calibrated=False) -> "str | None":
    import mlx.core as mx

    from . import kv_append
    from .attention import decode_attention
    from .attention.kernel import prepare_decode

    rng = np.random.default_rng(7)
    B, H, S, G, cap = 1, 2, 5, 2, 8
    k = rng.standard_normal((B, H, S, k_dim)).astype(np.float32)
    v = rng.standard_normal((B, H, S, v_dim)).astype(np.float32)
    mdt = getattr(mx, dtype)
    km, vm = mx.array(k).astype(mdt), mx.array(v).astype(mdt)
    app = kv_append.prepared(k_format, v_format, k_dim, v_dim, k_dp, v_dp, k_rot, v_rot, dtype, backend, opts,
                             calibrated=calibrated)
    kcal = qsc = None
    if calibrated:
        mu, sc = rng.standard_normal((H, k_dim)) * 0.5, np.exp(rng.standard_normal((H, k_dim)) * 0.3)
        kcal = kv_append.calibration_rows(mu, sc, H, k_dim)
        app = kv_append.CalibratedAppend(app, mx.array(kcal.reshape(-1)))
        # the scales as the lane hands them to the attention (TQCache.query_scale: query heads share theirs)
        qsc = mx.array(np.repeat(sc.astype(np.float32), G, axis=0).reshape(1, H * G, 1, k_dim))
    kc = mx.zeros((B, H, cap, app.k_row_bytes), mx.uint8)
    vc = mx.zeros((B, H, cap, app.v_row_bytes), mx.uint8)
    mx.eval(kc, vc)
    flag = app(km, vm, kc, vc, 0, mx.zeros((kv_append.flag_slots(B * H * S),), mx.uint32))
    mx.eval(flag)
    kin, vin = np.array(km.astype(mx.float32)), np.array(vm.astype(mx.float32))
    if kcal is not None:
        kin = kv_append.calibrate_rows(kin, kcal)
    for name, got, fmt, x, dp, rot in (("K", kc, k_format, kin, k_dp, k_rot), ("V", vc, v_format, vin, v_dp, v_rot)):
        want = kv_append.reference_append(fmt, x, dp, rot)
        if not np.array_equal(np.array(got)[:, :, :S], want):
            return f"the append kernel's {name} bytes differ from the reference"
    if k_dim != v_dim:
        return None
    q = mx.array(rng.standard_normal((B, H * G, 1, k_dim)).astype(np.float32)).astype(mdt)
    kw = dict(k_format=k_format, v_format=v_format, scale=k_dim ** -0.5, rotation=(k_rot, v_rot))
    launch = prepare_decode(q, kc, vc, backend="cpu-emulator" if backend == "cpu-emulator" else "auto", options=opts,
                            **kw)
    if launch is None:
        return "no prepared attention launch for this backend"
    got = np.array(launch(q, kc, vc, S, after=flag, q_scale=qsc).astype(mx.float32))
    # the reference with the q precision the launch runs (kernel int8-mma quantizes q to int8), over q * s
    # rounded to q's dtype where the launch scales q
    qp = launch.run_info.get("q_precision")
    qr = q if qsc is None else (q.astype(mx.float32) * qsc).astype(mdt)
    want = np.array(decode_attention(qr.astype(mx.float32), kc, vc, length=S, backend="reference", **kw,
                                     q_precision=qp or "exact"))
    err = float(np.abs(got - want).max())
    top = float(np.abs(want).max()) or 1.0
    if not err <= ATTENTION_TOLERANCE * top:
        return f"the fused attention differs from the reference by {err:.3g} (|out| up to {top:.3g})"
    return None
