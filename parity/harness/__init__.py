"""The parity harness: llama.cpp and MLX on the same GGUF, compared level by level.

runtimes (the two runtimes, KV specs), models (the real models' files), level_* (one module per level),
llama_arith (ggml-cpu's attention arithmetic, the levels' reference), transplant, metrics, report.
"""
