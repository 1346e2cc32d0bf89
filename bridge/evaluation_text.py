"""The fixed evaluation text: the stdlib's ``pydoc_data.topics`` help texts, topics in sorted order,
joined by blank lines.

It ships with Python, so every machine reads the same text (for one Python version) without a
download. Parity's logits level, ``tqbridge quality`` and the tokenizer export's check against
llama.cpp all read it from here.
"""

from __future__ import annotations


def evaluation_text() -> tuple[str, str]:
    """``(text, source)``: the text and one line saying where it comes from."""
    from pydoc_data import topics

    keys = sorted(topics.topics)
    return "\n\n".join(topics.topics[k] for k in keys), f"pydoc_data.topics ({len(keys)} topics, sorted, joined)"
