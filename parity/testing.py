"""tqbridge for other people's test suites: strategies, assertions and kernel fuzzing in one import.

::

    from tqbridge.parity import testing as tqt

``tqt.blocks(fmt=...)`` draws valid blocks of a registered format, ``tqt.reference_dequantize(fmt, b, n)``
decodes them as the bridge does and ``tqt.assert_values_close`` says where yours differ: docs/plugin.md
opens with that first test, written out.

The pytest plugin (:mod:`tqbridge.parity.plugin.pytest_plugin`) adds fixtures for the runtimes, the real
models and the hypothesis profiles; ``tqbridge fuzz`` runs long campaigns (:mod:`.fuzz`).
"""

from ..bridge import dequantize as reference_dequantize
from ..bridge import quantize as reference_quantize
from .plugin.assertions import (assert_attention_close, assert_blocks_equal, assert_logits_parity, assert_values_close,
                         describe_block)
from .plugin.byok import OPS, Case, Claim, FuzzResult, KernelClaimError, cases, check_case, claims, fuzz_kernel, snippet
from .plugin.strategies import FAMILIES, adversarial_rows, float_matrices, float_rows
from .plugin.strategies_attention import HEAD_DIMS, VALUE_KINDS, AttentionProblem, attention_problems
from .plugin.strategies_blocks import (AppendSequence, Malformed, blocks, format_blocks, format_names, kv_caches,
                                malformed_blocks, scale_offsets)

__all__ = [
    "reference_quantize", "reference_dequantize",
    "assert_blocks_equal", "assert_values_close", "assert_attention_close", "assert_logits_parity", "describe_block",
    "OPS", "Case", "Claim", "FuzzResult", "KernelClaimError", "cases", "check_case", "claims", "fuzz_kernel", "snippet",
    "FAMILIES", "float_rows", "float_matrices", "adversarial_rows",
    "HEAD_DIMS", "VALUE_KINDS", "AttentionProblem", "attention_problems",
    "AppendSequence", "Malformed", "blocks", "format_blocks", "format_names", "kv_caches", "malformed_blocks", "scale_offsets",
]
