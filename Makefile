# Quick start (see README.md):  make demo   |   make test
# Each target sets up .venv/ under the checkout by itself (installs, the llama-cpp-python build).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.tqbridge-installed
EXTRAS ?= all,models
# llama.cpp is compiled for a portable x86-64 baseline (SSE4.2, AVX, AVX2, FMA, F16C, BMI2) rather than
# -march=native: pip caches the wheel it builds, and a native build from one machine ends a model run on
# another with an illegal instruction. Set CMAKE_ARGS to choose your own flags.
ifeq ($(shell uname -m),x86_64)
CMAKE_ARGS ?= -DGGML_NATIVE=OFF
endif
export CMAKE_ARGS
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 2)

.PHONY: demo test fuzz bench venv clean-venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("tqbridge needs Python >= 3.10, found " + sys.version.split()[0]) if sys.version_info < (3, 10) else None'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@echo "installing tqbridge[$(EXTRAS)] into $(VENV) (the first run builds llama-cpp-python from source: ~5 min)"
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	@# a llama-cpp-python wheel from pip's cache may have been built for another CPU: drop it from the
	@# cache (the next setup builds and caches a portable one) and build one here, bypassing the cache
	@rc=0; $(BIN)/python -m tqbridge.bridge.llama.compat || rc=$$?; \
	if [ $$rc = 1 ]; then \
	  echo "rebuilding llama-cpp-python from source for this CPU (~5 min)"; \
	  $(BIN)/python -m pip cache remove llama_cpp_python >/dev/null 2>&1 || true; \
	  $(BIN)/python -m pip install -q --no-cache-dir --force-reinstall --no-deps \
	    "llama-cpp-python==$$($(BIN)/python -m tqbridge.bridge.llama.compat --version)" && \
	  $(BIN)/python -m tqbridge.bridge.llama.compat; \
	fi
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
