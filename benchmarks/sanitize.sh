#!/usr/bin/env bash
# The sanitizer stage: benchmarks/sanitize.py (every kernel family x dtype x
# strategy x path, checked against float64) and benchmarks/layout_build_check.py
# --quick (the GPU layout build) under compute-sanitizer's memcheck,
# racecheck, initcheck and synccheck. Run from the repository root on a machine
# with a GPU and the built extension:
#   bash benchmarks/sanitize.sh [OUTDIR] [TOOLS...]
# $SANITIZE_ARGS adds options of benchmarks/sanitize.py (--edge-only: the cases
# with per-edge inputs alone); $SANITIZE_SHARDS=N splits the cases over N
# processes in parallel (--shard).
# Writes one log per tool to OUTDIR (default: a temporary directory) and prints a
# summary line per tool; exits non-zero if any tool reports an error or a result
# is wrong. $PYTHON (default: python3) is the interpreter with pyg_dfgnn installed.
set -u -o pipefail
PYTHON=${PYTHON:-python3}
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
missing=()
"$PYTHON" -c "import sys, pyg_dfgnn; sys.exit(not pyg_dfgnn.has_cuda_kernels())" 2>/dev/null \
  || missing+=("a CUDA GPU with pyg_dfgnn's compiled extension (python -m pyg_dfgnn info)")
[ -x "$san" ] || missing+=("compute-sanitizer (on PATH or in /usr/local/cuda/bin)")
if [ ${#missing[@]} -gt 0 ]; then
  echo "benchmarks/sanitize.sh needs $(IFS=';'; echo "${missing[*]}" | sed 's/;/ and /')" >&2
  exit 2
fi
out=${1:-$(mktemp -d)}
shift || true
tools=${*:-memcheck racecheck initcheck synccheck}
mkdir -p "$out"
status=0
for tool in $tools; do
  extra=()
  # Without the caching allocator every tensor is its own allocation, so memcheck
  # sees an access past a tensor's end and initcheck an unwritten byte in it.
  if [ "$tool" = memcheck ] || [ "$tool" = initcheck ]; then
    export PYTORCH_NO_CUDA_MEMORY_CACHING=1
  else
    unset PYTORCH_NO_CUDA_MEMORY_CACHING
  fi
  [ "$tool" = memcheck ] && extra+=(--leak-check no)
  args=(--quick ${SANITIZE_ARGS:-})
  # initcheck does not see the writes of some of cuBLAS's half-precision GEMMs: a
  # plain clone() of such a GEMM's output is reported too, with no pyg_dfgnn code
  # involved (docs/design.md, "Sanitizers"). Its op-level cases draw every input
  # with torch.randn; the layers run under the three other tools.
  [ "$tool" = initcheck ] && args+=(--no-layers)
  t0=$(date +%s)
  # $SANITIZE_SHARDS processes in parallel, each with every N-th case
  # (racecheck takes minutes in one process); one log per process.
  n=${SANITIZE_SHARDS:-1}
  pids=()
  for ((i = 0; i < n; i++)); do
    log="$out/sanitize_$tool.log"; [ "$n" -gt 1 ] && log="$out/sanitize_$tool.$i.log"
    "$san" --tool "$tool" "${extra[@]}" --error-exitcode 3 --print-limit 50 \
      "$PYTHON" -m benchmarks.sanitize "${args[@]}" --shard "$i/$n" > "$log" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < n; i++)); do
    wait "${pids[$i]}"
    rc=$?
    log="$out/sanitize_$tool.log" label=$tool
    [ "$n" -gt 1 ] && log="$out/sanitize_$tool.$i.log" label="$tool (shard $i/$n)"
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1)
    failed=$(grep -E "^[0-9]+ failed" "$log" | tail -1)
    note=
    # racecheck reports hazards inside cuBLAS's own Hopper GEMM kernels (the
    # layers' half-precision projections), no pyg_dfgnn code involved
    # (docs/findings.md); a run whose every hazard lies in such kernels passes.
    if [ "$tool" = racecheck ] && [ $rc -ne 0 ] &&
        "$PYTHON" -m benchmarks.sanitize --judge-racecheck "$log" > /dev/null; then
      rc=0 note=" (every hazard in cuBLAS's kernels)"
    fi
    [ $rc -eq 0 ] || status=1
    echo "$label: rc=$rc ${summary:-no summary}$note | ${failed:-no result line} | $(( $(date +%s) - t0 )) s"
  done
  # The GPU layout build on its own: every CSC column-ordering path (warp, block,
  # cub), which the layers above do not all reach.
  t0=$(date +%s)
  "$san" --tool "$tool" "${extra[@]}" --error-exitcode 3 --print-limit 50 \
    "$PYTHON" -m benchmarks.layout_build_check --quick > "$out/layout_build_$tool.log" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/layout_build_$tool.log" | tail -1)
  echo "$tool, layout build: rc=$rc ${summary:-no summary} | $(tail -1 "$out/layout_build_$tool.log") | $(( $(date +%s) - t0 )) s"
  [ $rc -eq 0 ] || status=1
done
unset PYTORCH_NO_CUDA_MEMORY_CACHING
exit $status
