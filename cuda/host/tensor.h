// The tensor API of the host code that .cu files compile: at::Tensor with its
// methods, the few factory functions it calls (ATen's per-operator headers) and
// the current CUDA stream. <ATen/ATen.h> declares every operator, and nvcc parses
// a .cu file's headers three times (cudafe++, cicc, the host compiler): it cost
// about half of each .cu file's compile time. setup.py compiles .cu files with
// TORCH_ASSERT_ONLY_METHOD_OPERATORS, which makes including it there an error.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
