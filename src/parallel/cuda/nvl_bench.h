// corolla_parallel_bench's checks and timings of the NVLink kernels on NCCL's device API
// (nvl_allreduce.h, nvl_ep_exchange.h) against NCCL's own collectives. Collective: every rank
// of `comm` calls each with the same arguments; rank 0 prints when `print`.
#pragma once

#include <cstdint>
#include <vector>

#include "base/numeric.h"
#include "kernels/backend.h"
#include "parallel/communicator.h"
#include "parallel/expert_parallel.h"
#include "parallel/tcp_store.h"

namespace corolla {

// One rank's routing of T tokens: expert ids (global; -1: none) and weights, [T, K] each.
struct EpRouting {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// An exchange checked without a model: Dispatch x [T, H] (host bf16), run host "experts" on the
// received rows (a row scaled by each of its experts' global id + 1, weighted), Combine, and
// return the output [T, H] on the host. Collective over the exchange's communicator.
std::vector<bf16> RunExchangeWithHostExperts(Backend& backend, EpExchange& ex, int rank, int experts_per_rank,
                                             int64_t hidden, int top_k, const std::vector<bf16>& x,
                                             const EpRouting& routing);

// Our all-reduce (one-shot, two-shot) vs ncclAllReduce on random bf16 / f32 data, 1 element to
// 16 MiB with odd sizes; every rank's result bit-identical (hashes over the store); CUDA-graph
// capture and replay of back-to-back calls.
Status CheckNvlAllReduce(Backend& backend, Communicator& comm, TcpStore& store, bool print);
// Latency of decode-sized bf16 all-reduces (tokens x hidden): NCCL vs one-shot vs two-shot,
// eager (10 back-to-back calls per sample) and replayed from a CUDA graph of 10 calls.
Status BenchNvlAllReduce(Backend& backend, Communicator& comm, bool print);

// The NVLink DP-EP exchange vs AllToAllEpExchange (fixed capacity) on random routings (uneven
// and zero token counts, all tokens to one rank, repeated and invalid ids), host "experts"
// between dispatch and combine: outputs bit-identical; then graph-replayed with a device copy
// as the experts, against the exact host result.
Status CheckNvlEpExchange(Backend& backend, Communicator& comm, bool print);
// Dispatch and combine latency (tokens per rank x hidden, top-8 of 128 experts) of both
// exchanges, and the NVLink bandwidth the NVLink one reaches.
Status BenchNvlEpExchange(Backend& backend, Communicator& comm, bool print);

}  // namespace corolla
