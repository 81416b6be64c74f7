// Communicator: the collectives of one process group (a TP, EP or DP group), enqueued in order
// with the backend's work. The NCCL implementation (parallel/cuda) runs them on the CUDA
// backend's stream; the host implementation serves the CPU backend over the TcpStore, for
// tests and machines without GPUs. One thread per process uses a Communicator.
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"
#include "parallel/tcp_store.h"

namespace corolla {

// How an all-reduce moves data. kNccl: NCCL's own choice (ring/tree; its symmetric-memory
// kernels when the buffer is a registered window). kOneShot / kTwoShot: our NVLink kernels on
// NCCL symmetric memory for decode-sized messages (planned; NVLink multicast stays unused).
enum class AllReduceAlgo { kNccl, kOneShot, kTwoShot };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  virtual std::string name() const = 0;
  // x = sum over the group's ranks of x, in place. x is a contiguous tensor of the backend's
  // activation dtype (or f32) on its device; the sum is ordered after earlier ops of the
  // backend and before later ones, and identical on every rank.
  virtual void AllReduceSum(const TensorView& x) = 0;
};

// The CPU backend's communicator over `store`; the group must be the whole world (the store's
// collectives are world-wide). Sums in rank order, so every rank gets the same bits.
Result<std::unique_ptr<Communicator>> MakeHostCommunicator(TcpStore& store, int group_size, int group_rank);

}  // namespace corolla
