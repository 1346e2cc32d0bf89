# Quick start (see README.md):  make demo   |   make test
# Each target sets up .venv/ under the checkout by itself (installs, the llama-cpp-python build).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.tqbridge-installed
EXTRAS ?= all,models

.PHONY: demo test fuzz bench venv clean-venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("tqbridge needs Python >= 3.10, found " + sys.version.split()[0]) if sys.version_info < (3, 10) else None'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@echo "installing tqbridge[$(EXTRAS)] into $(VENV) (the first run builds llama-cpp-python from source: ~5 min)"
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tqbridge demo

test: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider $(PYTEST_ARGS)

# A 10-minute hypothesis campaign against the decode-attention kernel on the CPU emulator.
fuzz: $(STAMP)
	$(BIN)/tqbridge fuzz decode-attention --backend cpu-emulator --minutes 10 --jobs 2

# The attention benchmark (needs MLX on a GPU: CUDA or Metal).
bench: $(STAMP)
	$(BIN)/tqbridge bench attention --layers 16 --repeats 5 --json bench.json

clean-venv:
	rm -rf $(VENV)
