"""Mutation fuzzing of the parsers a user can point at a file: GGUF, llama.cpp state blobs, saved
prompt caches and ``--kv`` spellings (``tqbridge fuzz gguf|state-blob|prompt-cache|kv-spelling``).

Seeds are small real inputs made here (GGUF files written with gguf-py's ``GGUFWriter``, state blobs
written by :mod:`tqbridge.bridge.llama.state` and, when llama-cpp-python and SmolLM2 are installed,
one read from llama.cpp, prompt caches saved by mlx-lm's ``save_prompt_cache``, valid ``--kv``
spellings). Each mutant is 1-6 stacked mutations of a seed: bit flips, byte and integer-field
overwrites with boundary values (0, -1, 2^31, 2^32, 2^63, the file size, ...) at the seed's known
field offsets or anywhere, truncations, deletions, duplications, splices with another seed, and for
prompt caches and spellings structure-aware edits (hostile strings in the saved metadata, lying
shapes and dtypes, tokens of the spelling grammar).

Every mutant runs through each consumer of the target (e.g. for GGUF: ``inspect``, the model
loader, both ``convert`` outputs) in worker processes supervised by the parent, and each call ends
in one of:

- ``ok``: accepted;
- ``clean``: the module's own error class with a one-line message;
- ``crash``: any other exception (a traceback for the user), an error message of several lines, or
  the process dying (a signal);
- ``hang``: the call ran past the per-input time limit (the parent kills the worker);
- ``alloc``: ``MemoryError``, or the call's peak resident memory grew by more than
  ``ALLOC_SLACK + ALLOC_FACTOR x input size`` (measured per call: the kernel's peak-RSS counter is
  reset through ``/proc/self/clear_refs`` before it, and the worker's address space is capped so that
  an allocation sized by a hostile field fails instead of taking the machine);
- ``inconsistent``: accepted, but a property every accepted input must have failed (a state blob
  written back is not the same bytes; a spelling's canonical name parses to something else);
- ``upstream`` (prompt caches only): an error raised inside mlx-lm's loader or MLX's safetensors
  reader without passing through tqbridge code.

Findings are saved under the database (``$TQBRIDGE_CACHE/fuzz/<target>/findings``, or ``--db``), at
most a few inputs per distinct signature, and replayed first by later campaigns.

The modules, lowest first (each imports only those before it):

- :mod:`.target`: what a parser target is (:class:`ParserTarget`, :class:`Seed`, :class:`ParserFuzzError`);
- :mod:`.mutation`: the byte-level mutations every target gets (:class:`Mutator`, ``BOUNDARY``);
- :mod:`.gguf_target`, :mod:`.state_blob_target`, :mod:`.prompt_cache_target`,
  :mod:`.kv_spelling_target`: one per target: its seeds, its structure-aware mutation, how each of
  its consumers is called;
- :mod:`.named_targets`: the built-in targets by name (``PARSER_TARGETS``, :func:`make_target`) and a
  campaign's target name (or ``module:attr``) resolved to a target;
- :mod:`.outcome`: one consumer call on one input and its outcome (the limits, :func:`classify`,
  :func:`run_one`, :func:`check_input`);
- :mod:`.campaign`: the worker processes, the :class:`ParserCampaign` record and
  :func:`run_parser_campaign`.

Importing this package imports none of them.
"""
