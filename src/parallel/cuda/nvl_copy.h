// The copy bandwidth between this GPU and a peer over NVLink: the yardstick for the GB/s the
// NVLink kernels (all-reduce, EP dispatch/combine) reach. Measured three ways on one NCCL
// communicator, every rank at once (each rank r to rank r + 1, so every link carries traffic
// both ways as in an exchange): our copy kernel storing into the peer's part of a symmetric
// window (push), the same kernel loading from it (pull), and NCCL send/recv.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "parallel/communicator.h"

namespace corolla {

struct PeerCopyRate {
  double push_gbs = 0, pull_gbs = 0, nccl_gbs = 0;  // bytes one rank sends per second, 1e9
};

// `bytes` (a multiple of 16) per copy, the median of `iters` timed copies after a warm-up.
// Collective over `comm` (an NCCL communicator of ranks on one node).
Result<PeerCopyRate> BenchPeerCopy(Communicator& comm, int64_t bytes, int iters);

}  // namespace corolla
