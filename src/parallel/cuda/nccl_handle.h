// The NCCL communicator and stream behind a Communicator made by MakeNcclCommunicator, for the
// CUDA-side code of parallel/cuda that builds its own collectives on them (symmetric memory,
// device-API kernels). Internal to parallel/cuda: it exposes NCCL and CUDA types.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <optional>

#include "kernels/cuda/cuda_check.h"
#include "parallel/communicator.h"

// Every NCCL call goes through here: statement, file:line (COROLLA_CHECK), device, NCCL's message.
#define COROLLA_NCCL_CHECK(stmt)                                                               \
  do {                                                                                         \
    ncclResult_t corolla_nr_ = (stmt);                                                         \
    COROLLA_CHECK(corolla_nr_ == ncclSuccess)                                                  \
        << "NCCL error on device " << ::corolla::cuda::CurrentDevice() << ": "                \
        << ncclGetErrorString(corolla_nr_) << " in " #stmt;                                    \
  } while (0)

namespace corolla {

struct NcclHandle {
  ncclComm_t comm;
  cudaStream_t stream;  // the backend's
  int size, rank;
};

// nullopt when `comm` is not an NCCL communicator.
std::optional<NcclHandle> NcclHandleOf(Communicator& comm);

}  // namespace corolla
