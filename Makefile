# pyg_dfgnn: set-up, training example and tests.
#
#   make train   create .venv, install the package, train on Cora (native vs. fused)
#   make test    create .venv, install the package, run the tests
#   make clean   remove build outputs (make distclean also removes .venv)
#
# The CUDA extension is compiled only where it can run (nvidia-smi sees a GPU) or
# when asked: make test CUDA_EXT=1 (CI does; FORCE_CUDA=1 works too). CUDA_EXT=0
# installs the pure-PyTorch path only. The venv is created once (stamp files in
# .venv/); the package is reinstalled when setup.py, pyproject.toml, a file under
# cuda/ or CUDA_EXT changes.

SHELL := /bin/bash
.SHELLFLAGS := -e -o pipefail -c

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
# Arguments of `make train`, e.g. make train ARGS="--model gat --epochs 300"
ARGS   ?=
# Extra pytest arguments, e.g. make test PYTEST_ARGS="-k datasets"
PYTEST_ARGS ?=
# Data folder of `make train` (Planetoid/Cora/raw/...): the checkout's neighbour
# ../shared/data when it exists and $PYG_DFGNN_DATA is unset; else PyG downloads.
DATA ?= $(if $(PYG_DFGNN_DATA),,$(wildcard ../shared/data))

# CUDA_EXT unset: compile where nvidia-smi sees a GPU (setup.py then falls back to
# the pure-PyTorch path without a CUDA toolkit). CUDA_EXT=1 asked for: a build
# that cannot compile the extension fails.
ifndef CUDA_EXT
ifeq ($(FORCE_CUDA),1)
CUDA_EXT := 1
else
CUDA_EXT := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0)
CUDA_EXT_DETECTED := 1
endif
endif

TORCH_VERSION ?= 2.14.1
DEPS := torch==$(TORCH_VERSION) torch_geometric tqdm pytest hypothesis matplotlib numpy scipy \
        ninja "setuptools>=64" wheel

DEPS_STAMP  := $(VENV)/.deps.stamp
BUILD_STAMP := $(VENV)/.build.stamp
EXT_STAMP   := $(VENV)/.cuda_ext.$(CUDA_EXT)
BUILD_INPUTS := setup.py pyproject.toml $(wildcard cuda/*/*)

.PHONY: venv train test clean distclean help

help:
	@echo "make train   - set up .venv, install, train on Cora (ARGS=\"--model gat ...\")"
	@echo "make test    - set up .venv, install, run pytest (PYTEST_ARGS=...)"
	@echo "make venv    - only set up .venv and install the package"
	@echo "CUDA_EXT=1|0 - compile the CUDA extension or not (default: 1 if nvidia-smi sees a GPU)"
	@echo "make clean   - remove build outputs; make distclean also removes .venv"

venv: $(BUILD_STAMP)

$(DEPS_STAMP):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install $(DEPS)
	touch $@

# A switch of CUDA_EXT makes a new $(EXT_STAMP), newer than the build stamp.
$(EXT_STAMP): $(DEPS_STAMP)
	rm -f $(VENV)/.cuda_ext.*
	touch $@

# Install the package; with CUDA_EXT=1 compile pyg_dfgnn._C against the venv's torch
# (3-4 minutes on 2 cores).
$(BUILD_STAMP): $(DEPS_STAMP) $(EXT_STAMP) $(BUILD_INPUTS)
ifeq ($(CUDA_EXT),1)
	source .ci/env.sh && $(if $(CUDA_EXT_DETECTED),,FORCE_CUDA=1) \
	  $(PIP) install --no-build-isolation --no-deps -e .
else
	@echo "pyg_dfgnn: no GPU seen, installing without compiling the CUDA extension (CUDA_EXT=1 compiles it)"
	PYG_DFGNN_NO_EXT=1 $(PIP) install --no-build-isolation --no-deps -e .
endif
	touch $@

train: venv
	$(PY) examples/train.py $(if $(DATA),--data $(DATA)) $(ARGS)

test: venv
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf build dist *.egg-info .pytest_cache
	rm -f pyg_dfgnn/_C*.so $(BUILD_STAMP) $(VENV)/.cuda_ext.*
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
