// Communicator: the collectives of one process group (a TP, EP or DP group), enqueued in order
// with the backend's work. The NCCL implementation (parallel/cuda) runs them on the CUDA
// backend's stream; the host implementation serves the CPU backend over the TcpStore, for
// tests and machines without GPUs. One thread per process uses a Communicator.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/check.h"
#include "kernels/backend.h"
#include "parallel/tcp_store.h"

namespace corolla {

// How an all-reduce moves data. kNccl: NCCL's own choice (ring/tree). kOneShot / kTwoShot: our
// NVLink kernels on NCCL symmetric memory (parallel/cuda/nvl_allreduce.h; NVLink multicast
// stays unused). kAuto: ours for messages up to a size where they win, NCCL above.
enum class AllReduceAlgo { kAuto, kNccl, kOneShot, kTwoShot };

// "auto", "nccl", "oneshot", "twoshot" (COROLLA_ALLREDUCE); nullopt for anything else.
// Inline: the NCCL communicator (corolla_parallel_cuda) parses it, and corolla_parallel links
// that library, not the other way round.
inline const char* AllReduceAlgoName(AllReduceAlgo algo) {
  switch (algo) {
    case AllReduceAlgo::kAuto: return "auto";
    case AllReduceAlgo::kNccl: return "nccl";
    case AllReduceAlgo::kOneShot: return "oneshot";
    case AllReduceAlgo::kTwoShot: return "twoshot";
  }
  return "?";
}
inline std::optional<AllReduceAlgo> ParseAllReduceAlgo(std::string_view name) {
  for (AllReduceAlgo a : {AllReduceAlgo::kAuto, AllReduceAlgo::kNccl, AllReduceAlgo::kOneShot, AllReduceAlgo::kTwoShot})
    if (name == AllReduceAlgoName(a)) return a;
  return std::nullopt;
}

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
  // How later AllReduceSum calls move data; every rank of the group must choose alike. The
  // NCCL communicator starts from COROLLA_ALLREDUCE (default auto) and falls back to NCCL for
  // what its kernels do not take (other dtypes, no symmetric memory); others ignore it.
  virtual void set_all_reduce_algo(AllReduceAlgo algo) { (void)algo; }

  // --- all-to-all (expert parallelism's dispatch and combine) -----------------------------
  // A row is one slice of dim 0 of a contiguous tensor (any dtype); every rank uses the same
  // row size. Both calls are ordered with the backend's work like AllReduceSum.
  //
  // Equal blocks: send and recv are [size() * n, ...]; block p of send goes to group rank p,
  // block p of recv comes from rank p. No host synchronisation, so it may be captured in a
  // CUDA graph: it carries the fixed-capacity dispatch, and the per-peer counts ([size()] i32)
  // that precede an AllToAllV.
  void AllToAll(const TensorView& send, const TensorView& recv) {
    COROLLA_CHECK(send.dim(0) % size() == 0 && recv.dim(0) == send.dim(0))
        << "all-to-all of " << send.ToString() << " into " << recv.ToString() << " over " << size() << " ranks";
    const std::vector<int64_t> counts(size(), send.dim(0) / size());
    AllToAllV(send, counts, recv, counts);
  }
  // Variable sizes: send holds sum(send_counts) rows in peer order, send_counts[p] of them for
  // rank p; recv receives rank p's rows at row sum(recv_counts[0..p)). recv_counts[p] must be
  // what rank p passes as send_counts[rank()] (exchange the counts first with AllToAll); zero
  // counts, to or from anyone, are fine. Host-side counts: the caller has read them already.
  virtual void AllToAllV(const TensorView& send, std::span<const int64_t> send_counts, const TensorView& recv,
                         std::span<const int64_t> recv_counts) = 0;
};

// The CPU backend's communicator over `store`; the group must be the whole world (the store's
// collectives are world-wide). Sums in rank order, so every rank gets the same bits.
Result<std::unique_ptr<Communicator>> MakeHostCommunicator(TcpStore& store, int group_size, int group_rank);
// The same for the group `ranks` (world ranks in group-rank order, this rank among them) over a
// TcpStore of its own, a star on ranks[0]: its port (and address, when it is not world rank 0,
// whose address is `master_addr`) travels in one AllGather of the world `store`, so every world
// rank calls this, in the same order, for one group each (its own; all groups of a kind at once).
Result<std::unique_ptr<Communicator>> MakeHostGroupCommunicator(TcpStore& store, const std::vector<int>& ranks,
                                                                const std::string& master_addr);

}  // namespace corolla
