# pyg_dfgnn: set-up, training example and tests.
#
#   make train   create .venv, install the package, train on Cora (native vs. fused)
#   make test    create .venv, install the package, run the tests
#   make clean   remove build outputs (make distclean also removes .venv)
#
# The CUDA extension is compiled only where it can run (nvidia-smi sees a GPU) or
# when asked: make test CUDA_EXT=1 (CI does; FORCE_CUDA=1 works too). A later plain
# `make` keeps an extension compiled that way; CUDA_EXT=0 installs the pure-PyTorch
# path only (and removes a compiled extension). The venv is created once (stamp
# files in .venv/); the package is reinstalled when setup.py, pyproject.toml, a
# file under cuda/ or CUDA_EXT changes.

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
# Data folder of `make train` and `make test` (Planetoid/Cora/raw/...), passed as
# $PYG_DFGNN_DATA: the variable if set, else a shared/data folder next to the
# checkout when there is one; else PyG downloads what it needs.
DATA ?= $(or $(PYG_DFGNN_DATA),$(wildcard ../shared/data))

# CUDA_EXT unset: compile where nvidia-smi sees a GPU (setup.py then falls back to
# the pure-PyTorch path without a CUDA toolkit), and keep an extension that an
# earlier CUDA_EXT=1 compiled. CUDA_EXT=1 asked for: a build that cannot compile
# the extension fails.
ifndef CUDA_EXT
ifeq ($(FORCE_CUDA),1)
CUDA_EXT := 1
else ifneq ($(wildcard $(VENV)/.cuda_ext.1),)
CUDA_EXT := 1
CUDA_EXT_KEPT := 1
else
CUDA_EXT := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0)
CUDA_EXT_DETECTED := 1
endif
endif

TORCH_VERSION ?= 2.14.1
# rdkit: the molecule tests build a few molecules from SMILES (seconds), never the
# whole of MoleculeNet HIV
DEPS := torch==$(TORCH_VERSION) torch_geometric tqdm pytest hypothesis matplotlib numpy scipy \
        rdkit ninja "setuptools>=64" wheel

DEPS_STAMP  := $(VENV)/.deps.stamp
SPARSE_STAMP := $(VENV)/.sparse.stamp
BUILD_STAMP := $(VENV)/.build.stamp
EXT_STAMP   := $(VENV)/.cuda_ext.$(CUDA_EXT)
BUILD_INPUTS := setup.py pyproject.toml $(wildcard cuda/*/*)

.PHONY: venv train test clean distclean help

help:
	@echo "make train   - set up .venv, install, train on Cora (ARGS=\"--model gat ...\")"
	@echo "make test    - set up .venv, install, run pytest (PYTEST_ARGS=...)"
	@echo "make venv    - only set up .venv and install the package"
	@echo "CUDA_EXT=1|0 - compile the CUDA extension or not (default: 1 if nvidia-smi sees a GPU"
	@echo "               or an earlier CUDA_EXT=1 compiled it)"
	@echo "DATA=DIR     - data folder (Planetoid/Cora/raw/...; default: \$$PYG_DFGNN_DATA)"
	@echo "make clean   - remove build outputs; make distclean also removes .venv"

venv: $(BUILD_STAMP)
ifdef CUDA_EXT_KEPT
	@echo "pyg_dfgnn: keeping the CUDA extension an earlier CUDA_EXT=1 build compiled (CUDA_EXT=0 removes it)"
endif

$(DEPS_STAMP):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install $(DEPS)
	touch $@

# torch_scatter and torch_sparse (SparseTensor inputs and their tests) are source
# distributions only: built against the pinned torch, so after it and without build
# isolation (a quarter of an hour or more on 2 cores; pip caches the wheels, so a
# later venv takes seconds). Their own stamp also brings them into an older venv.
$(SPARSE_STAMP): $(DEPS_STAMP)
	$(PIP) install --no-build-isolation torch_scatter torch_sparse
	touch $@

# A switch of CUDA_EXT makes a new $(EXT_STAMP), newer than the build stamp.
$(EXT_STAMP): $(DEPS_STAMP)
	rm -f $(VENV)/.cuda_ext.*
	touch $@

# Install the package; with CUDA_EXT=1 compile pyg_dfgnn._C against the venv's torch
# (3-4 minutes on 2 cores).
$(BUILD_STAMP): $(DEPS_STAMP) $(EXT_STAMP) $(BUILD_INPUTS) | $(SPARSE_STAMP)
ifeq ($(CUDA_EXT),1)
	source .ci/env.sh && $(if $(CUDA_EXT_DETECTED),,FORCE_CUDA=1) \
	  $(PIP) install --no-build-isolation --no-deps -e .
else
	@echo "pyg_dfgnn: $(if $(CUDA_EXT_DETECTED),no GPU seen,CUDA_EXT=0): installing without compiling the CUDA extension (CUDA_EXT=1 compiles it)"
	PYG_DFGNN_NO_EXT=1 $(PIP) install --no-build-isolation --no-deps -e .
endif
	@$(PY) -c "from pyg_dfgnn import extension as e; print('pyg_dfgnn: extension', 'loaded' if e.HAS_EXTENSION else e.missing_reason())"
	touch $@

train: venv
	$(if $(DATA),PYG_DFGNN_DATA=$(DATA)) $(PY) examples/train.py $(ARGS)

test: venv
	$(if $(DATA),PYG_DFGNN_DATA=$(DATA)) $(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf build dist *.egg-info .pytest_cache
	rm -f pyg_dfgnn/_C*.so pyg_dfgnn/_build_info.json $(BUILD_STAMP) $(VENV)/.cuda_ext.*
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
