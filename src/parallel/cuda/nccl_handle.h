// The NCCL communicator and stream behind a Communicator made by MakeNcclCommunicator, for the
// CUDA-side code of parallel/cuda that builds its own collectives on them (symmetric memory,
// device-API kernels). Internal to parallel/cuda: it exposes NCCL and CUDA types.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <optional>

#include "parallel/communicator.h"

namespace corolla {

struct NcclHandle {
  ncclComm_t comm;
  cudaStream_t stream;  // the backend's
  int size, rank;
};

// nullopt when `comm` is not an NCCL communicator.
std::optional<NcclHandle> NcclHandleOf(Communicator& comm);

}  // namespace corolla
