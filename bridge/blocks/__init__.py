"""Block formats: the registry, one codec class per family, rows <-> blocks."""
