"""GGUF files and the models built from them."""
