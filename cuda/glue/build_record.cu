// The build's own record: the torch and CUDA versions this library was compiled
// against and the GPU architectures it holds code for. pyg_dfgnn.extension reads
// it from the library file (behind the marker, without loading the library, which
// fails against another torch) or through the exported symbol once loaded, so what
// `python -m pyg_dfgnn info` reports travels with the build, not with the source
// tree. A .cu file: nvcc defines __CUDA_ARCH_LIST__ (the -gencode targets) here.
#include <cuda_runtime_api.h>
#include <torch/version.h>

#define DFGNN_STR2(...) #__VA_ARGS__
#define DFGNN_STR(...) DFGNN_STR2(__VA_ARGS__)

extern "C" __attribute__((used, visibility("default"))) const char pyg_dfgnn_build_record[] =
    "pyg_dfgnn-build-record:{\"torch\": \"" DFGNN_STR(TORCH_VERSION_MAJOR) "." DFGNN_STR(
        TORCH_VERSION_MINOR) "." DFGNN_STR(TORCH_VERSION_PATCH) "\", \"cudart\": " DFGNN_STR(
        CUDART_VERSION) ", \"nvcc\": \"" DFGNN_STR(__CUDACC_VER_MAJOR__) "." DFGNN_STR(
        __CUDACC_VER_MINOR__) "\", \"arch\": [" DFGNN_STR(__CUDA_ARCH_LIST__) "]}";
