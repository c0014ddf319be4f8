# Environment for building the CUDA extension against the venv's torch.
# CUDA_HOME must be the real toolkit root (torch guesses wrong from the nvcc wrapper on PATH);
# the CUDA build of torch ships cuSPARSE/cuBLAS headers under site-packages/nvidia/cu13/include.
for d in /usr/local/cuda-13.0 /usr/local/cuda; do
  if [ -x "$d/bin/nvcc" ] && [ -f "$d/include/cuda_runtime.h" ]; then export CUDA_HOME="${CUDA_HOME:-$d}"; break; fi
done
_nv_inc=$(ls -d "$PWD"/.venv/lib/python3*/site-packages/nvidia/cu13/include 2>/dev/null | head -1)
[ -n "$_nv_inc" ] && export CPATH="$_nv_inc${CPATH:+:$CPATH}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export MAX_JOBS="${MAX_JOBS:-2}"
