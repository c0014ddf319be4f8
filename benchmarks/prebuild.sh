#!/usr/bin/env bash
# Builds the extension here, off the GPU machine, for a device call to use instead
# of building it there (its build takes 2-3 minutes of the session's device time):
#
#   benchmarks/prebuild.sh VENV OUT.so.xz [REV]
#
# VENV: a virtual environment with the GPU machine's Python (major.minor) and torch
# release, e.g. `python3.12 -m venv V && V/bin/pip install torch==2.11.0` (there,
# `python3 -c "import sys, torch; print(sys.version, torch.__version__)"` tells).
# REV (default HEAD) is built from a clean copy (git archive), for
# TORCH_CUDA_ARCH_LIST (default 9.0), and written xz-compressed (a third of its
# size: a device call carries at most 64 MiB) beside OUT.so.xz.inputs, the hash of
# its build inputs (benchmarks/build_inputs_hash.sh). device_run.sh's build stage
# takes it with PREBUILT=OUT.so.xz where the tree's hash matches and the library
# loads, and builds as before otherwise.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 VENV OUT.so.xz [REV]"; exit 2; }
venv="$(cd "$1" && pwd)" out="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")" rev="${3:-HEAD}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
git archive "$rev" | tar -x -C "$tmp"
(cd "$tmp" && TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" FORCE_CUDA=1 \
  MAX_JOBS="${MAX_JOBS:-2}" "$venv/bin/python" setup.py build_ext --inplace > build.log 2>&1) ||
  { tail -40 "$tmp/build.log"; exit 1; }
xz -T2 -6 -c "$tmp"/pyg_dfgnn/_C*.so > "$out"
bash benchmarks/build_inputs_hash.sh "$tmp" > "$out.inputs"
echo "prebuilt $(git rev-parse --short "$rev"): $out ($(du -h "$out" | cut -f1)), inputs $(cat "$out.inputs")"
