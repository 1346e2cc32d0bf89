"""tqbridge.bridge: block formats both runtimes agree on to the byte, and conversions between them.

Public API::

    formats() -> list[str]                      every addressable format name
    get_format(name) -> Format                  block size, type size, bits per value, type ids
    quantize(fmt, x) / dequantize(fmt, blocks, n)          numpy reference
    mlx_quantize(fmt, x) / mlx_dequantize(fmt, blocks, n)  MLX arrays, byte-identical
    padded_dim(fmt, d) / pad_rows(fmt, x) / unpad_rows(fmt, y, d)   explicit zero padding to whole blocks
    to_mlx_affine(fmt, blocks, n) / from_mlx_affine(fmt, w, scales, biases, group_size, bits)
                                                lossless ggml <-> MLX affine (q8_0, q4_0, q4_1, q5_0, q5_1)
"""

from .blocks.affine import from_mlx_affine, to_mlx_affine
from .blocks.api import dequantize, mlx_dequantize, mlx_quantize, quantize
from .blocks.format_types import Format, FormatError
from .blocks.padding import pad_rows, padded_dim, unpad_rows
from .blocks.registry import all_formats, display_name, formats, get_format

__all__ = [
    "Format", "FormatError", "all_formats", "display_name", "formats", "get_format",
    "quantize", "dequantize", "mlx_quantize", "mlx_dequantize",
    "padded_dim", "pad_rows", "unpad_rows",
    "to_mlx_affine", "from_mlx_affine",
]
