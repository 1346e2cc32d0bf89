"""tqbridge.parity: do llama.cpp and MLX agree?

- :mod:`.harness`: the parity harness: the two runtimes, the levels (blocks, cache, attention,
  teacher forcing, the GPU decode lane, logits), KV transplant, metrics and reports (``tqbridge parity``).
- :mod:`.quality`: KV-cache quality against the f16 cache, KL and bytes per token (``tqbridge quality``).
- :mod:`.plugin`: the testing toolkit for other people's kernels: the pytest plugin, hypothesis
  strategies and profiles, assertions, bring-your-own-kernel fuzzing (``tqbridge fuzz``);
  :mod:`.testing` is its one public import.
"""
