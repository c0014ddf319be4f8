# pyg_dfgnn: set-up, training example and tests.
#
#   make train   create .venv, build the extension, train on Cora (native vs. fused)
#   make test    create .venv, build the extension, run the tests
#   make clean   remove build outputs (make distclean also removes .venv)
#
# The venv is created once (stamp files in .venv/); the extension is rebuilt when
# setup.py, pyproject.toml or a file under cuda/ changes.

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

TORCH_VERSION ?= 2.14.1
DEPS := torch==$(TORCH_VERSION) torch_geometric tqdm pytest matplotlib numpy scipy ninja \
        "setuptools>=64" wheel

DEPS_STAMP  := $(VENV)/.deps.stamp
BUILD_STAMP := $(VENV)/.build.stamp
BUILD_INPUTS := setup.py pyproject.toml $(wildcard cuda/*)

.PHONY: venv train test clean distclean help

help:
	@echo "make train   - set up .venv, build, train on Cora (ARGS=\"--model gat ...\")"
	@echo "make test    - set up .venv, build, run pytest (PYTEST_ARGS=...)"
	@echo "make venv    - only set up .venv and build the extension"
	@echo "make clean   - remove build outputs; make distclean also removes .venv"

venv: $(BUILD_STAMP)

$(DEPS_STAMP):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install $(DEPS)
	touch $@

# Build the CUDA extension (pyg_dfgnn._C) against the venv's torch. Without a CUDA
# toolkit, setup.py installs the pure-PyTorch reference path only.
$(BUILD_STAMP): $(DEPS_STAMP) $(BUILD_INPUTS)
	source .ci/env.sh && $(PIP) install --no-build-isolation --no-deps -e .
	touch $@

train: venv
	$(PY) examples/train.py $(ARGS)

test: venv
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf build dist *.egg-info .pytest_cache
	rm -f pyg_dfgnn/_C*.so $(BUILD_STAMP)
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
