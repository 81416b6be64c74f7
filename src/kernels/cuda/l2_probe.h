// Does a weight slice prefetched into L2 survive the MoE's weight stream? (CudaPerf.
// L2RetentionUnderStream; the question of notes/decode_sessions.md, Session 14: the next layer's
// qkv weights, 21 MB at Qwen3-30B-A3B, prefetched while the MoE streams 75 MB evict-first, would
// let the staged qkv GEMV copy them from L2.) And a gap in the stream that prefetches ranges
// into L2 while it holds it (CudaPerf.MoeDecodeL2Warm, session 55: does the batch-1 MoE gain
// from its experts moved during the attention and routing, when the HBM idles?).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace corolla::cuda {

// Microseconds for one CTA an SM to bulk-copy its share of a `region_bytes` slice of weights into
// shared memory (the staged GEMV's read), medians over the rounds, in each case:
struct L2RetentionProbe {
  double cold_us = 0;            // the slice not read since L2 was flushed
  double hot_us = 0;             // read again at once (in L2 under the normal policy)
  double prefetched_us = 0;      // prefetched evict-last, nothing between
  double last_stream_us = 0;     // prefetched evict-last, then `stream_bytes` read evict-first
  double normal_stream_us = 0;   // prefetched evict-normal, then the same stream
  double last_normal_stream_us = 0;  // prefetched evict-last, then the stream read normally
  double region_mb = 0;
};

// `buf` holds at least 2 GB of device memory (distinct slices per case and round, and a flush
// area); region_bytes at most the SMs x 200 KB; stream_bytes at most 512 MB.
L2RetentionProbe RunL2RetentionProbe(void* buf, int64_t buf_bytes, int64_t region_bytes, int64_t stream_bytes,
                                     int rounds, cudaStream_t s);

// Up to 16 device ranges to prefetch into L2.
struct L2Ranges {
  static constexpr int kMax = 16;
  const void* p[kMax] = {};
  int64_t bytes[kMax] = {};
  int n = 0;
};

// A latency-bound phase of the decode step as a gap in the stream (CudaPerf.MoeDecodeL2Warm):
// `ctas` CTAs hold the stream for `ns` nanoseconds from their entry; first, warp 0 of each issues
// its share of every range of `prefetch` as evict-normal L2 bulk prefetches (none where n is 0),
// which proceed during the gap.
void LaunchL2Gap(const L2Ranges& prefetch, uint64_t ns, int ctas, cudaStream_t s);

}  // namespace corolla::cuda
