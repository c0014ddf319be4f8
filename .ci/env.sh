# Environment for building the CUDA extension against the venv's torch. setup.py finds
# the toolkit (CUDA_HOME, else the nvcc on PATH, else /usr/local/cuda*) and the cuSPARSE /
# cuBLAS headers (the toolkit's, else those of torch's nvidia-* wheels) itself; CI has no
# GPU, so it names the architecture to compile for.
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export MAX_JOBS="${MAX_JOBS:-2}"
