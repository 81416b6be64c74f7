// NvlAllReduce: one-shot and two-shot all-reduce kernels over NVLink on an NCCL symmetric
// window (NCCL's device API: LSA pointers and LSA barriers; never NVLink multicast). Owned by
// one NcclCommunicator and used by its thread on the backend's stream; every call is
// collective. No host synchronisation: the calls may be captured in CUDA graphs.
//
// Layout of the window on every rank: [2 parities][ranks][kSlotBytes]. Slot s of parity q on
// rank r receives what rank s pushes to r in a call of parity q. Block b of every rank handles
// the same 4 KiB chunks (b, b + kMaxBlocks, ...) of every message, whatever its size (a block
// with no chunk is not launched, on any rank), and synchronises with LSA barrier b. The parity
// is block b's own call counter on the device (graph replays alternate like eager calls): when
// block b passes the barrier of its next call, block b of each peer has finished reading this
// call's parity, so the call after may overwrite it. One barrier per call (one-shot) or two
// (two-shot); the sum runs in rank order in f32 and rounds once: every rank gets the same bits.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>

#include "parallel/cuda/symmetric.h"
#include "tensor/tensor.h"

namespace corolla {

class NvlAllReduce {
 public:
  static constexpr int kMaxRanks = 8;
  static constexpr int kThreads = 256;                  // one 16-byte vector per thread per chunk
  static constexpr int64_t kChunkBytes = 16 * kThreads;  // 4 KiB
  static constexpr int kMaxBlocks = 128;                // = the LSA barriers it uses
  static constexpr int64_t kSlotBytes = int64_t{8} << 20;  // larger messages go in 8 MiB pieces

  // Collective over `comm` (size ranks). Unsupported when the group is too large or some rank
  // is not load/store-reachable.
  static Result<std::unique_ptr<NvlAllReduce>> Create(ncclComm_t comm, int size, int rank);
  ~NvlAllReduce();

  // bf16 or f32, contiguous, 16-byte aligned, on the GPU.
  static bool Supports(const TensorView& x);
  // x = sum over the ranks, in place, on `stream`. Every rank calls it with the same size and
  // `two_shot`: one-shot pushes the whole message to every peer and each rank sums all of them;
  // two-shot pushes each peer its 1/N share, the owner sums it and pushes the sum back.
  void Run(const TensorView& x, bool two_shot, cudaStream_t stream);

 private:
  NvlAllReduce() = default;
  std::unique_ptr<SymmetricMemory> mem_;
  uint32_t* calls_ = nullptr;  // [kMaxBlocks] calls made by each block (device; parity = & 1)
  int size_ = 0, rank_ = 0;
};

}  // namespace corolla
