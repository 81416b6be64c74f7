// SymmetricMemory: one NCCL symmetric window (the same size on every rank of a communicator,
// each rank's part load/store-accessible from the others over NVLink) and the device
// communicator whose LSA barriers the kernels that use it synchronise with. Made and freed
// collectively: every rank of the communicator creates it with the same arguments, in the same
// order as its other collective calls. Owned by one thread, like the communicator.
// NVLink multicast is never requested (the machines keep NCCL_NVLS_ENABLE=0).
#pragma once

#include <nccl.h>

#include <cstddef>
#include <memory>

#include "base/status.h"

struct ncclDevComm;  // nccl_device/core.h (device code includes it; host code passes it along)

namespace corolla {

class SymmetricMemory {
 public:
  // `bytes` (rounded up to NCCL's 4 KiB window alignment) on every rank, zero-filled, and a
  // device communicator with `num_lsa_barriers` LSA barriers. Unavailable when some rank of
  // `comm` is not load/store-reachable (another node): callers then keep to NCCL's own calls.
  static Result<std::unique_ptr<SymmetricMemory>> Create(ncclComm_t comm, size_t bytes, int num_lsa_barriers);
  ~SymmetricMemory();  // device communicator, then the window, then the memory
  SymmetricMemory(const SymmetricMemory&) = delete;
  SymmetricMemory& operator=(const SymmetricMemory&) = delete;

  void* local() const { return local_; }  // this rank's part
  size_t bytes() const { return bytes_; }
  ncclWindow_t window() const { return window_; }
  const ncclDevComm& dev_comm() const { return *dev_comm_; }
  int num_lsa_barriers() const { return num_lsa_barriers_; }

 private:
  SymmetricMemory() = default;
  ncclComm_t comm_ = nullptr;
  void* local_ = nullptr;
  size_t bytes_ = 0;
  ncclWindow_t window_ = nullptr;
  std::unique_ptr<ncclDevComm> dev_comm_;
  int num_lsa_barriers_ = 0;
};

}  // namespace corolla
