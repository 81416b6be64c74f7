// MoePermute (moe_permute.h): count the pairs of each expert, scan the counts into row offsets,
// place each pair at its expert's next row, with shared-memory atomics only (no global atomic,
// no memset). Within a prompt the routing crowds onto a few experts, so the counters are hot:
// the warps of a CTA count into kHists histograms (warp w into w % kHists), and a column scan
// turns each histogram's counts into the first rows of its pairs. A CTA has 1024 threads (a
// thread an expert in the scans), each thread kPer pairs, their ids loaded into registers before
// any atomic. On an H200 (E 128, k 8; `CudaPerf.MoePermute`, graph replay) one histogram with one
// atomic per distinct expert in a warp (__match_any_sync) took 21.7 us for 1024 tokens in one CTA
// against 13.4 with 8 histograms; both are bound by the atomics of one SM, so larger batches
// spread their pairs over CTAs of kChunkPer pairs a thread: 8.6 us at 1024 tokens, 9.3 at 8192
// and 15.3 at 32768 (the kernels before, a global atomic a pair, a one-thread scan: ~64 us at
// 8192 tokens by ncu).
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_permute.h"
#include "kernels/cuda/timeline.cuh"
#include "kernels/cuda/timeline.h"
#include "kernels/cuda/tuning.h"

namespace corolla::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kOneCtaPer = 8;  // pairs a thread of the one-CTA kernel (8192 a CTA at most)
constexpr int kChunkPer = 2;   // pairs a thread of the chunked kernels
constexpr int kChunkPairs = kThreads * kChunkPer;
constexpr int kHists = 8;  // histograms a CTA counts into
static_assert(kMoePermuteMaxExperts <= kThreads, "the scans give each expert a thread");

struct PermuteParams {
  const int32_t* ids;
  int64_t ids_stride;
  int64_t pairs;
  int top_k, experts;
  MoePermutation out;
  int32_t* chunk_counts;  // [chunks, E]: the pairs of each chunk per expert (chunked path)
  int32_t* chunk_first;   // [chunks, E]: the first row of each chunk's pairs per expert
  int chunks;
  uint64_t* timeline = nullptr;  // the one-CTA kernel's record (COROLLA_TIMELINE)
};

// The experts of this thread's pairs of chunk c (pair c * kThreads * kPer + j * kThreads + tid),
// -1 past the end or where the id is skipped. The loads are issued before any is used.
template <int kPer>
__device__ __forceinline__ void LoadExperts(const PermuteParams& p, int c, int (&e)[kPer]) {
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = (static_cast<int64_t>(c) * kPer + j) * kThreads + threadIdx.x;
    e[j] = i < p.pairs ? p.ids[(i / p.top_k) * p.ids_stride + i % p.top_k] : -1;
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (e[j] >= p.experts) e[j] = -1;
}

// Exclusive prefix sum of v over the CTA's threads in thread order; *total gets the sum. Every
// thread calls it.
__device__ int BlockExclusiveScan(int v, int* total) {
  __shared__ int warp_sums[kThreads / 32];
  __shared__ int sum;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int incl = v;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int o = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += o;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int w = warp_sums[lane];
    int wi = w;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int o = __shfl_up_sync(0xffffffffu, wi, d);
      if (lane >= d) wi += o;
    }
    warp_sums[lane] = wi - w;
    if (lane == 31) sum = wi;
  }
  __syncthreads();
  const int excl = incl - v + warp_sums[warp];
  *total = sum;
  __syncthreads();  // warp_sums and sum are free again
  return excl;
}

// Thread e < E: the offsets and the active list from the experts' counts (count: expert e's, 0
// for threads past E); returns expert e's first row. Every thread calls it.
__device__ int WriteOffsets(const PermuteParams& p, int count) {
  const int e = threadIdx.x;
  int rows, num_active;
  const int first = BlockExclusiveScan(count, &rows);
  const int rank = BlockExclusiveScan(count > 0 ? 1 : 0, &num_active);
  if (e < p.experts) {
    p.out.offsets[e] = first;
    if (p.out.active != nullptr && count > 0) p.out.active[rank] = e;
  }
  if (e == 0) {
    p.out.offsets[p.experts] = rows;
    if (p.out.active != nullptr) p.out.active[p.experts] = num_active;
  }
  return first;
}

// This warp's histogram of the CTA's kHists [kHists][E].
__device__ __forceinline__ int32_t* HistOf(int32_t* hist, int experts) {
  return hist + (threadIdx.x / 32) % kHists * experts;
}

// Zeroes the CTA's histograms, loads its pairs of chunk c and counts them; thread e < E returns
// the CTA's pairs on expert e (0 past E).
template <int kPer>
__device__ __forceinline__ int LoadAndCount(const PermuteParams& p, int c, int (&e)[kPer],
                                            int32_t* hist) {
  for (int i = threadIdx.x; i < kHists * p.experts; i += kThreads) hist[i] = 0;
  LoadExperts<kPer>(p, c, e);
  __syncthreads();
  int32_t* h = HistOf(hist, p.experts);
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (e[j] >= 0) atomicAdd(&h[e[j]], 1);
  __syncthreads();
  int total = 0;
  if (threadIdx.x < p.experts) {
#pragma unroll
    for (int k = 0; k < kHists; ++k) total += hist[k * p.experts + threadIdx.x];
  }
  return total;
}

// Thread e < E: each histogram's counter of expert e becomes the first row of its pairs, from
// `first` on. The caller syncs before PlacePairs.
__device__ __forceinline__ void ColumnToCursors(int32_t* hist, int experts, int first) {
  if (threadIdx.x >= experts) return;
#pragma unroll
  for (int k = 0; k < kHists; ++k) {
    const int c = hist[k * experts + threadIdx.x];
    hist[k * experts + threadIdx.x] = first;
    first += c;
  }
}

// Places this thread's pairs of chunk c (experts e) at the rows its histogram's cursors give.
template <int kPer>
__device__ __forceinline__ void PlacePairs(const PermuteParams& p, int c, const int (&e)[kPer],
                                           int32_t* hist) {
  int32_t* h = HistOf(hist, p.experts);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = (static_cast<int64_t>(c) * kPer + j) * kThreads + threadIdx.x;
    if (i >= p.pairs) continue;
    if (e[j] < 0) {
      p.out.slot_row[i] = -1;
      continue;
    }
    const int row = atomicAdd(&h[e[j]], 1);
    p.out.slot_row[i] = row;
    p.out.perm_token[row] = static_cast<int32_t>(i / p.top_k);
  }
}

// Every pair in one CTA (pairs <= kThreads * kOneCtaPer).
__global__ void __launch_bounds__(kThreads)
    PermuteOneCtaKernel(const __grid_constant__ PermuteParams p) {
  TimelineScope tl(p.timeline);
  tl.Waited();  // a plain launch: it enters once the kernel before has finished
  __shared__ int32_t hist[kHists * kMoePermuteMaxExperts];
  int e[kOneCtaPer];
  const int count = LoadAndCount<kOneCtaPer>(p, 0, e, hist);
  ColumnToCursors(hist, p.experts, WriteOffsets(p, count));
  __syncthreads();
  PlacePairs<kOneCtaPer>(p, 0, e, hist);
}

// Chunked path, 1 of 3: chunk_counts[c][e], the pairs of chunk c (one CTA each) on expert e.
__global__ void __launch_bounds__(kThreads)
    ChunkCountKernel(const __grid_constant__ PermuteParams p) {
  __shared__ int32_t hist[kHists * kMoePermuteMaxExperts];
  int e[kChunkPer];
  const int count = LoadAndCount<kChunkPer>(p, blockIdx.x, e, hist);
  if (threadIdx.x < p.experts)
    p.chunk_counts[static_cast<int64_t>(blockIdx.x) * p.experts + threadIdx.x] = count;
}

// 2 of 3 (one CTA): each expert's total over the chunks, scanned into the offsets, and each
// chunk's first row per expert.
__global__ void __launch_bounds__(kThreads)
    ChunkScanKernel(const __grid_constant__ PermuteParams p) {
  const int32_t* __restrict__ counts = p.chunk_counts;
  int32_t* __restrict__ firsts = p.chunk_first;
  const int e = threadIdx.x;
  int total = 0;
  if (e < p.experts) {
#pragma unroll 8
    for (int c = 0; c < p.chunks; ++c) total += counts[static_cast<int64_t>(c) * p.experts + e];
  }
  int row = WriteOffsets(p, total);
  if (e < p.experts) {
#pragma unroll 8
    for (int c = 0; c < p.chunks; ++c) {
      const int64_t at = static_cast<int64_t>(c) * p.experts + e;
      firsts[at] = row;
      row += counts[at];
    }
  }
}

// 3 of 3: chunk c counts its pairs again into the histograms, whose column scan from the chunk's
// first rows places them.
__global__ void __launch_bounds__(kThreads)
    ChunkPlaceKernel(const __grid_constant__ PermuteParams p) {
  __shared__ int32_t hist[kHists * kMoePermuteMaxExperts];
  int e[kChunkPer];
  LoadAndCount<kChunkPer>(p, blockIdx.x, e, hist);
  if (threadIdx.x < p.experts)
    ColumnToCursors(hist, p.experts,
                    p.chunk_first[static_cast<int64_t>(blockIdx.x) * p.experts + threadIdx.x]);
  __syncthreads();
  PlacePairs<kChunkPer>(p, blockIdx.x, e, hist);
}

}  // namespace

int64_t MoePermuteScratchInts(int64_t pairs, int experts) {
  return 2 * static_cast<int64_t>(CeilDiv(pairs, kChunkPairs)) * experts;
}

void MoePermute(const int32_t* ids, int64_t ids_stride, int64_t tokens, int top_k, int experts,
                const MoePermutation& out, int32_t* scratch, cudaStream_t s) {
  COROLLA_CHECK(experts > 0 && experts <= kMoePermuteMaxExperts && top_k > 0)
      << "moe permute: " << experts << " experts (1.." << kMoePermuteMaxExperts << "), top "
      << top_k;
  const int64_t pairs = tokens * top_k;
  if (pairs == 0) return;
  const int chunks = CeilDiv(pairs, kChunkPairs);
  PermuteParams p{
      ids,     ids_stride, pairs,   top_k,
      experts, out,        scratch, scratch + static_cast<int64_t>(chunks) * experts,
      chunks};
  if (pairs <= std::min<int64_t>(Tuning().moe_permute_one_cta_max_pairs, kThreads * kOneCtaPer)) {
    p.timeline = TimelineRecord("MoePermute", 1, s);
    PermuteOneCtaKernel<<<1, kThreads, 0, s>>>(p);
    COROLLA_CUDA_CHECK_LAUNCH();
    return;
  }
  ChunkCountKernel<<<chunks, kThreads, 0, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
  ChunkScanKernel<<<1, kThreads, 0, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
  ChunkPlaceKernel<<<chunks, kThreads, 0, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

}  // namespace corolla::cuda
