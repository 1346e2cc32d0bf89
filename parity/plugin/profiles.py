"""The hypothesis profiles, defined once.

- ``ci``: derandomized and bounded (60 examples per property): what a CI machine with 2 cores and
  no GPU runs, tqbridge's own suite included.
- ``dev``: random seeds, 300 examples, for local work.
- ``deep``: long campaigns, 3000 examples (on a GPU too).

The pytest plugin registers them as ``tqbridge-<name>``, tqbridge's test suite (tests/conftest.py)
under the bare names, and ``tqbridge fuzz --profile`` runs :data:`EXAMPLES` examples per campaign.
Importing this module imports nothing optional; :func:`register` needs hypothesis.
"""

from __future__ import annotations

EXAMPLES = {"ci": 60, "dev": 300, "deep": 3000}


def register(prefix: str = "tqbridge-") -> None:
    """Register every profile with hypothesis as ``prefix + name``."""
    from hypothesis import HealthCheck, settings

    common = dict(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    for name, n in EXAMPLES.items():
        settings.register_profile(prefix + name, max_examples=n, derandomize=name == "ci", **common)
