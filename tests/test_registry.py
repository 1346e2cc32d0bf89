import numpy as np
import pytest

from tqbridge import bridge
from tqbridge.bridge import FormatError
from tqbridge.bridge.blocks.registry import kernel_ids
from helpers_kernels import c_ids


def test_formats_listed_with_sizes():
    names = bridge.formats()
    for legacy in ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]:
        assert legacy in names
    q8 = bridge.get_format("q8_0")
    assert (q8.block_size, q8.type_size, q8.bits_per_value, q8.type_ids["ggml"]) == (32, 34, 8.5, 8)
    assert bridge.get_format("IQ4_NL").type_ids["ggml"] == 20


def test_layout_keeps_leading_axes():
    x = np.zeros((2, 3, 64), np.float32)
    b = bridge.quantize("q4_0", x)
    assert b.dtype == np.uint8 and b.shape == (2, 3, 36)
    assert bridge.dequantize("q4_0", b, 64).shape == (2, 3, 64)


@pytest.mark.parametrize("bad, match", [("q9_9", "unknown format"), ("q8_0@nope", "unknown format")])
def test_unknown_format_is_a_clear_error(bad, match):
    with pytest.raises(FormatError, match=match):
        bridge.get_format(bad)


def test_bad_lengths_are_clear_errors():
    with pytest.raises(FormatError, match="multiple of its block size 32"):
        bridge.quantize("q8_0", np.zeros(33, np.float32))
    with pytest.raises(FormatError, match="takes 34 bytes"):
        bridge.dequantize("q8_0", np.zeros(33, np.uint8), 32)
    with pytest.raises(FormatError, match="uint8"):
        bridge.dequantize("q8_0", np.zeros(34, np.int8), 32)


def test_kernel_format_ids_are_the_c_constants():
    """The kernels switch on numeric format ids baked into their sources; the registry's kernel_id
    must be those numbers: TQA_<NAME> (decode, attention_kernel.h), QA_<NAME> (encode, one block at
    a time, quantize_append.h; turbo formats share QA_TURBO), QA_<NAME>_REF (llama.cpp's cache encoder)."""
    import importlib

    attention_formats = importlib.import_module("tqbridge.metal.attention.formats")
    quantize_append = importlib.import_module("tqbridge.metal.quantize_append")  # the package exports a function of that name
    fmts = bridge.all_formats()
    upper = {f.name.upper() for f in fmts}
    ids = kernel_ids()
    assert len(set(ids.values())) == len(ids)
    assert attention_formats.FORMAT_IDS == ids
    tqa = c_ids("attention_kernel.h", "TQA_")
    assert {k: v for k, v in tqa.items() if k in upper} == {n.upper(): i for n, i in ids.items()}
    qa = c_ids("quantize_append.h", "QA_")
    encoders = {f.name.upper(): f.kernel_id for f in fmts if f.kernel_id is not None and f.kind != "turbo"}
    assert {k: v for k, v in qa.items() if k in upper} == encoders
    refs = {f.name.upper() + "_REF": f.cache_kernel_id for f in fmts if f.cache_kernel_id is not None}
    assert refs and {k: qa.get(k) for k in refs} == refs
    assert qa["TURBO"] == quantize_append._TURBO
    assert len({*encoders.values(), *refs.values(), qa["TURBO"]}) == len(encoders) + len(refs) + 1


def test_tables_derived_from_the_registry():
    """The per-format tables other modules use are views of the registry entries (values pinned)."""
    from tqbridge.bridge.blocks.affine import affine_formats
    from tqbridge.parity.harness.level_attention import GGML_FA_FORMATS
    from tqbridge.parity.harness.level_blocks import GGML_FORMATS
    from tqbridge.parity.harness.runtimes import LLAMA_KV_TYPES

    ggml = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
    assert LLAMA_KV_TYPES == GGML_FORMATS == ggml
    assert GGML_FA_FORMATS == ("f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
    assert affine_formats() == ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
    assert kernel_ids() == {**{n: i for i, n in enumerate(ggml)}, "turbo2": 9, "turbo3": 10, "turbo4": 11}
    assert {f.key: dict(f.cache_options) for f in bridge.all_formats() if f.cache_options} == {"iq4_nl": {"search": False}}
