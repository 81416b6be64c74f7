// corolla_parallel_bench's checks and timings of the NVLink kernels on NCCL's device API
// (nvl_allreduce.h, nvl_ep_exchange.h) against NCCL's own collectives. Collective: every rank
// of `comm` calls each with the same arguments; rank 0 prints when `print`.
#pragma once

#include "kernels/backend.h"
#include "parallel/communicator.h"
#include "parallel/tcp_store.h"

namespace corolla {

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
