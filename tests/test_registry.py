import numpy as np
import pytest

from tqbridge import bridge
from tqbridge.bridge import FormatError


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
