#!/usr/bin/env bash
# One hash of what the extension is compiled from (setup.py, pyproject.toml and the
# files under cuda/) of the tree DIR (default: this script's), the same in a
# checkout and in the copy a device call runs in: a prebuilt extension
# (benchmarks/prebuild.sh) serves a tree whose hash it carries.
#   benchmarks/build_inputs_hash.sh [DIR]
set -euo pipefail
cd "${1:-$(dirname "${BASH_SOURCE[0]}")/..}"
find cuda setup.py pyproject.toml -type f | LC_ALL=C sort | xargs sha1sum | sha1sum | cut -d' ' -f1
