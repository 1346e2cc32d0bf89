"""The testing toolkit for kernels, tqbridge's own and other people's (docs/plugin.md).

pytest_plugin (fixtures; loaded through the ``pytest11`` entry point), profiles (the hypothesis
profiles), strategies* (hypothesis strategies), assertions, byok / byok_source (bring your own
kernel), fuzz / parsers (``tqbridge fuzz`` campaigns). The public one-import facade is
:mod:`tqbridge.parity.testing`. Importing this package imports nothing optional.
"""
