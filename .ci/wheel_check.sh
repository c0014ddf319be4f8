#!/usr/bin/env bash
# Builds the wheel a user's `pip install .` would install, installs it into a fresh
# virtual environment and smoke-tests it from outside the repository
# (.ci/wheel_smoke.py): the check that sees what tests of the editable install
# cannot, such as a subpackage missing from the wheel.
#
#   .ci/wheel_check.sh VENV [--expect-extension]
#
# VENV: the environment whose torch the wheel is built against (`make`'s .venv).
# The fresh environment sees VENV's packages through a path entry (not as a site
# directory, so VENV's editable install of pyg_dfgnn stays invisible), so nothing
# is downloaded.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv="$(cd "$1" && pwd)"; shift
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$venv/bin/pip" wheel --no-deps --no-build-isolation -w "$tmp/dist" . >"$tmp/wheel.log" 2>&1 ||
  { cat "$tmp/wheel.log"; exit 1; }
"$venv/bin/python" -m venv "$tmp/env"
site="$("$tmp/env/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
"$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))' >"$site/deps.pth"
"$tmp/env/bin/python" -m pip install -q --no-deps --no-index "$tmp"/dist/pyg_dfgnn-*.whl
(cd "$tmp" && "$tmp/env/bin/python" "$OLDPWD/.ci/wheel_smoke.py" --forbid "$OLDPWD" "$@")
echo "wheel check passed: $(basename "$tmp"/dist/pyg_dfgnn-*.whl)"
