#include "parallel/cuda/symmetric.h"

#include <cuda_runtime.h>
#include <nccl_device.h>

#include <string>

#include "kernels/cuda/cuda_check.h"

namespace corolla {
namespace {

Status NcclStatus(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::Ok();
  return Internal(std::string(what) + ": " + ncclGetErrorString(r) + " (device " +
                  std::to_string(cuda::CurrentDevice()) + ")");
}

}  // namespace

Result<std::unique_ptr<SymmetricMemory>> SymmetricMemory::Create(ncclComm_t comm, size_t bytes, int num_lsa_barriers) {
  int ranks = 0;
  RETURN_IF_ERROR(NcclStatus(ncclCommCount(comm, &ranks), "ncclCommCount"));
  const ncclTeam_t lsa = ncclTeamLsa(comm);
  if (lsa.nRanks != ranks)
    return Unsupported("symmetric memory: only " + std::to_string(lsa.nRanks) + " of " + std::to_string(ranks) +
                       " ranks are load/store-reachable");
  auto mem = std::unique_ptr<SymmetricMemory>(new SymmetricMemory());
  mem->comm_ = comm;
  mem->bytes_ = (bytes + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT * NCCL_WIN_REQUIRED_ALIGNMENT;
  mem->num_lsa_barriers_ = num_lsa_barriers;
  RETURN_IF_ERROR(NcclStatus(ncclMemAlloc(&mem->local_, mem->bytes_), "ncclMemAlloc"));
  COROLLA_CUDA_CHECK(cudaMemset(mem->local_, 0, mem->bytes_));
  COROLLA_CUDA_CHECK(cudaDeviceSynchronize());  // zeros in place before any peer may look
  RETURN_IF_ERROR(NcclStatus(
      ncclCommWindowRegister(comm, mem->local_, mem->bytes_, &mem->window_, NCCL_WIN_COLL_SYMMETRIC),
      "ncclCommWindowRegister"));
  ncclDevCommRequirements reqs{};  // everything off: no multimem (NVLink multicast), no GIN
  reqs.lsaMultimem = false;
  reqs.lsaBarrierCount = num_lsa_barriers;
  auto dev_comm = std::make_unique<ncclDevComm>();
  RETURN_IF_ERROR(NcclStatus(ncclDevCommCreate(comm, &reqs, dev_comm.get()), "ncclDevCommCreate"));
  mem->dev_comm_ = std::move(dev_comm);
  return Result<std::unique_ptr<SymmetricMemory>>(std::move(mem));
}

SymmetricMemory::~SymmetricMemory() {
  // Kernels that may still use the window run on streams of this device: let them finish.
  cudaDeviceSynchronize();
  if (dev_comm_ != nullptr) ncclDevCommDestroy(comm_, dev_comm_.get());
  if (window_ != nullptr) ncclCommWindowDeregister(comm_, window_);
  if (local_ != nullptr) ncclMemFree(local_);
}

}  // namespace corolla
