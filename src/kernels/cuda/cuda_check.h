// COROLLA_CUDA_CHECK(stmt) / COROLLA_CUBLAS_CHECK(stmt): every CUDA runtime and cuBLAS(Lt) call of
// the CUDA backend goes through one of these; a failure aborts naming the statement, file:line,
// the current device and the error string. COROLLA_CUDA_CHECK_LAUNCH() checks the last launch.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "base/check.h"

namespace corolla::cuda {

inline int CurrentDevice() {
  int d = -1;
  cudaGetDevice(&d);
  return d;
}

}  // namespace corolla::cuda

#define COROLLA_CUDA_CHECK(stmt)                                                          \
  do {                                                                                    \
    cudaError_t corolla_err_ = (stmt);                                                    \
    COROLLA_CHECK(corolla_err_ == cudaSuccess)                                            \
        << "CUDA error on device " << ::corolla::cuda::CurrentDevice() << ": "           \
        << cudaGetErrorName(corolla_err_) << " (" << cudaGetErrorString(corolla_err_)     \
        << ") in " #stmt;                                                                  \
  } while (0)

#define COROLLA_CUBLAS_CHECK(stmt)                                                        \
  do {                                                                                    \
    cublasStatus_t corolla_st_ = (stmt);                                                  \
    COROLLA_CHECK(corolla_st_ == CUBLAS_STATUS_SUCCESS)                                   \
        << "cuBLAS error on device " << ::corolla::cuda::CurrentDevice() << ": "         \
        << cublasLtGetStatusString(corolla_st_) << " in " #stmt;                            \
  } while (0)

#define COROLLA_CUDA_CHECK_LAUNCH() COROLLA_CUDA_CHECK(cudaGetLastError())
