#!/usr/bin/env bash
# One call on a GPU machine, from the repository root: build the extension, run the
# CUDA tests, the kernel benchmark and the Cora training, with logs and JSON under $OUT.
#   STAGES="build test fuzz sanitize bench ab train flex minibatch multigpu" bash benchmarks/device_run.sh [pytest -k expr]
# flex: the FlexAttention yardstick's tests (tests/test_flex_bench.py), which the
# test stage leaves out.
# fuzz: tests/test_fuzz.py under its gpu profile (the kernels against PyG in
# float64 on drawn graphs and options), which the test stage's default profile
# runs on the CPU.
# sanitize: benchmarks/sanitize.sh (every kernel path under memcheck, racecheck,
# initcheck and synccheck, the four tools in parallel), logs in $OUT/sanitize.
# minibatch: benchmarks/minibatch.py ($MB_ARGS) and examples/train_minibatch.py on
# PyG's NeighborLoader. Without pyg-lib that needs torch_sparse: CPU-only wheels of
# torch_scatter 2.1.2 and torch_sparse 0.6.18 in $WHEELS (built against the GPU
# machine's torch and Python, FORCE_ONLY_CPU=1; setuptools builds torch_sparse's
# twelve extensions one after another, about ten minutes) are installed into a
# folder of their own, on the path of those two commands only: a CPU-only
# torch_scatter takes PyG's CUDA segment reductions and fails them ("Not compiled
# with CUDA support"), so the tests must not see it.
# multigpu: benchmarks.multi_gpu over the machine's GPUs ($MG_ARGS, default both
# tasks and models, fused and native, fp32 and bf16, with the time split), the node task's
# NeighborLoader from the same $WHEELS folder as minibatch; a sitecustomize there
# hides the CPU-only torch_scatter from PyG, whose CUDA reductions it would take.
# $MG_OUT (default $OUT/multi_gpu): a folder kept between calls, with --resume in
# $MG_ARGS, continues one record over several calls.
# ab: a benchmark of this tree against a base tree, both built, in one call:
# $AB_BASE is a tarball of the base (git archive BASE | gzip > FILE, carried beside
# the tree), built in /tmp/dfgnn_ab_base; this tree is built in place unless the
# build stage ran. Runs of the fused methods alternate base, new ($AB_ROUNDS rounds,
# default 2), each its own tree's benchmarks.$AB_BENCH: kernels (default; five
# GPU-bound graphs and one host-bound), layers (the edge models on PATTERN and the
# web graph) or half_precision (the dot rows of four batch graphs and GitHub in
# bf16, no FlexAttention); $AB_ARGS replaces the default arguments.
# benchmarks.kernels_ab compares them into $OUT/ab/ab.json.
# PREBUILT=FILE.so.xz (benchmarks/prebuild.sh, carried): the build stage (and the ab
# stage for this tree) takes that library where it was built from this tree's
# sources and loads, else builds; AB_BASE_PREBUILT likewise for the ab stage's base.
# Real graphs are read from .devdata/ when it exists (a git-ignored copy of the data
# folder's subsets), else from $PYG_DFGNN_DATA.
set -o pipefail
export TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/dfgnn_out}; mkdir -p "$OUT"
[ -d .devdata ] && export PYG_DFGNN_DATA="$PWD/.devdata"
STAGES=${STAGES:-"build test bench train flex"}
PY=python3
has() { [[ " $STAGES " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$PY -c "import torch, torch_geometric; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'pyg', torch_geometric.__version__)"
kernels_load() {
  $PY -c "import pyg_dfgnn; assert pyg_dfgnn.has_cuda_kernels(), pyg_dfgnn.load_error(); print('kernels loaded')"
}
# use_prebuilt DIR FILE.so.xz: puts the prebuilt library into the tree DIR where it
# was built from DIR's sources and loads there (status 0), else leaves none (1).
use_prebuilt() {
  local dir=$1 file=$2 so
  [ -n "$file" ] || return 1
  if [ "$(cat "$file.inputs" 2>/dev/null)" != "$(bash benchmarks/build_inputs_hash.sh "$dir")" ]; then
    echo "build: $file was built from other sources than $dir's; building"; return 1
  fi
  so="$dir/pyg_dfgnn/_C$($PY -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
  $PY -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    "$file" "$so"
  (cd "$dir" && kernels_load) && return 0
  rm -f "$so"; echo "build: $file does not load in $dir; building"; return 1
}
if has build; then
  t0=$(date +%s)
  if use_prebuilt "$PWD" "${PREBUILT:-}"; then
    # Not installed: the tree's root on the path, for the commands started elsewhere.
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    echo "build: prebuilt $PREBUILT"
  else
    $PY -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
    kernels_load || exit 1
    echo "build: $(( $(date +%s) - t0 )) s"
  fi
fi
if has test; then
  # 14 workers and a per-test limit: the whole CUDA suite in about 3 minutes on an
  # H200 host, and a hung test named instead of the call's time running out; -v
  # prints each result as it lands, so a log cut short still names its failures.
  # The FlexAttention yardstick's tests compile their kernels with inductor (one
  # did not finish in 300 s on a loaded host), so they are a stage of their own
  # (flex), after the others: neither the tests' results nor the benchmark's can
  # be cut off by them.
  $PY -m pytest -m cuda -v -n "${PYTEST_WORKERS:-14}" --timeout "${PYTEST_TIMEOUT:-300}" -rfE \
    -p no:cacheprovider --ignore=tests/test_flex_bench.py tests/ ${1:+-k "$1"} \
    > "$OUT/pytest_cuda.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_cuda.log" | tail -25
fi
if has flex; then
  $PY -m pytest -m cuda -v -n 4 --timeout "${PYTEST_TIMEOUT:-300}" -rfE -p no:cacheprovider \
    tests/test_flex_bench.py ${1:+-k "$1"} > "$OUT/pytest_cuda_flex.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_cuda_flex.log" | tail -10
fi
if has fuzz; then
  $PY -m pytest -q -n "${PYTEST_WORKERS:-14}" -rfE -p no:cacheprovider tests/test_fuzz.py \
    --fuzz-profile=gpu > "$OUT/pytest_fuzz_gpu.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_fuzz_gpu.log" | tail -10
fi
if has sanitize; then
  for tool in memcheck racecheck initcheck synccheck; do
    bash benchmarks/sanitize.sh "$OUT/sanitize" $tool > "$OUT/sanitize_$tool.txt" 2>&1 &
  done
  wait
  cat "$OUT"/sanitize_*.txt
fi
if has testall; then
  $PY -m pytest -q -p no:cacheprovider tests/ 2>&1 | tee "$OUT/pytest_all.log" | tail -15
fi
if has bench; then
  $PY -m benchmarks.kernels ${BENCH_ARGS:-} --out "$OUT/kernels.json" 2> "$OUT/kernels.err" | tee "$OUT/kernels.txt"
  tail -3 "$OUT/kernels.err"
fi
if has ab; then
  [ -f "${AB_BASE:-}" ] || { echo "ab: set AB_BASE to a tarball of the base tree"; exit 1; }
  ab=$OUT/ab base=/tmp/dfgnn_ab_base; mkdir -p "$ab"
  rm -rf "$base"; mkdir -p "$base"; tar xzf "$AB_BASE" -C "$base"
  # AB_BASE_PREBUILT / PREBUILT: the base's and this tree's prebuilt libraries.
  base_pre=0 new_pre=0
  use_prebuilt "$base" "${AB_BASE_PREBUILT:-}" && base_pre=1
  if has build || use_prebuilt "$PWD" "${PREBUILT:-}"; then new_pre=1; fi
  if [ $base_pre = 0 ] && [ $new_pre = 1 ]; then
    (cd "$base" && $PY setup.py build_ext --inplace > "$ab/build_base.log" 2>&1)
  elif [ $base_pre = 0 ]; then
    (cd "$base" && MAX_JOBS=8 $PY setup.py build_ext --inplace > "$ab/build_base.log" 2>&1) &
    MAX_JOBS=8 $PY setup.py build_ext --inplace > "$ab/build_new.log" 2>&1
    wait
  elif [ $new_pre = 0 ]; then
    $PY setup.py build_ext --inplace > "$ab/build_new.log" 2>&1
  fi
  for d in "$base" "$PWD"; do
    (cd "$d" && kernels_load > /dev/null) \
      || { echo "ab: no kernels in $d"; tail -30 "$ab"/build_*.log; exit 1; }
  done
  bench=${AB_BENCH:-kernels} rec=.json
  case $bench in
    layers) args=${AB_ARGS:-"--methods fused --models gt_edge,gat_edge,gatv2_edge --graphs PATTERN,web-NotreDame-like"} ;;
    # its --out is a folder that gets half_precision.json
    half_precision) rec=/half_precision.json
      args=${AB_ARGS:-"--graphs PATTERN,CLUSTER,MNIST,COCO-SP-like,GitHub --layers dot-1x128,dot-4x32 --dtypes bf16 --flex-dtypes= --flex-forms="} ;;
    *) args=${AB_ARGS:-"--fused-only --no-compile --graphs PATTERN,CLUSTER,COCO-SP,GitHub,Reddit-like,PubMed"} ;;
  esac
  for i in $(seq "${AB_ROUNDS:-2}"); do
    for side in base new; do
      d=$PWD; [ $side = base ] && d=$base
      out=$ab/${side}_$i; [ "$rec" = .json ] && out=$out.json
      (cd "$d" && $PY -m benchmarks.$bench $args \
        --out "$out" > "$ab/${side}_$i.txt" 2> "$ab/${side}_$i.err")
      echo "ab: $side run $i rc=$?"
    done
  done
  $PY -m benchmarks.kernels_ab --base "$ab"/base_*"$rec" --new "$ab"/new_*"$rec" \
    --out "$ab/ab.json" | tee "$ab/ab.txt"
fi
if has train; then
  for m in gt gat; do
    $PY examples/train.py --model $m --impl both --json "$OUT/train_$m.json" 2>&1 | tail -8 | tee -a "$OUT/train.txt"
  done
fi
site=/tmp/pyg_dfgnn_loader_site
if [ -n "${WHEELS:-}" ] && { has minibatch || has multigpu; }; then
  $PY -m pip install -q --no-deps --no-index --target "$site" "$WHEELS"/*.whl || exit 1
fi
if has multigpu; then
  mg_site=/tmp/pyg_dfgnn_mg_site
  mkdir -p "$mg_site"
  printf 'import torch_geometric.typing as T\nT.WITH_TORCH_SCATTER = False\n' > "$mg_site/sitecustomize.py"
  PYTHONPATH="$mg_site:$site${PYTHONPATH:+:$PYTHONPATH}" $PY -m benchmarks.multi_gpu \
    ${MG_ARGS:---tasks graph node --models gat gt --amp none bf16 --time-split --timeout 300} \
    --out "${MG_OUT:-$OUT/multi_gpu}" 2>&1 | tee "$OUT/multi_gpu.txt" | tail -30
fi
if has minibatch; then
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" $PY -m benchmarks.minibatch ${MB_ARGS:-} \
    --out "$OUT/minibatch.json" 2> "$OUT/minibatch.err" | tee "$OUT/minibatch.txt" | tail -40
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" $PY examples/train_minibatch.py \
    --epochs "${MB_EPOCHS:-3}" 2>&1 | grep -E "epoch|fuse|sampler" | tee "$OUT/train_minibatch.txt"
fi
