// NCCL communicators on the CUDA backend's stream (CUDA builds only; no CUDA type leaks out of
// this header, so code above the kernels may include it). NCCL_NVLS_ENABLE=0 is forced before
// any communicator is made: NVLink multicast is never used on these machines.
#pragma once

#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace corolla {

// A fresh ncclUniqueId as bytes (made by a group's first rank, handed to the others).
Result<std::string> NcclUniqueId();

// Rank `rank` of a group of `size` on GPU `device` (the backend's), running on the backend's stream.
Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(Backend& backend, int device, const std::string& unique_id,
                                                           int size, int rank);

// Whether AllReduceSum can use the NVLink kernels (parallel/cuda/nvl_allreduce.h) on `comm`:
// its symmetric memory was set up (not with COROLLA_ALLREDUCE=nccl, nor across nodes).
bool HasNvlAllReduce(Communicator& comm);

// All-reduce latency of NCCL on this communicator for each message size (bytes of bf16), median
// of `iters` CUDA-graph-free launches timed with events, in microseconds. With `symmetric`, the
// buffer comes from ncclMemAlloc and is registered as a symmetric window (NCCL then picks its
// symmetric-memory kernels). Collective: every rank of the group calls it with the same sizes.
Result<std::vector<double>> BenchNcclAllReduce(Communicator& comm, const std::vector<int64_t>& sizes, int iters,
                                               bool symmetric);

}  // namespace corolla
