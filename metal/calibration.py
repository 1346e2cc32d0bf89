"""Old import path of :mod:`tqbridge.metal.lm.calibration` (moved with the rest of the mlx-lm integration,
issue 16). This name is bound to that very module object, so attribute reads, ``from ... import``
and monkeypatching through it reach the one implementation."""

import sys

from .lm import calibration as _module

sys.modules[__name__] = _module
