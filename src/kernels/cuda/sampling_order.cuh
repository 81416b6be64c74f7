// Each sampled row's logits in sampling order, the input of sampling.cu's SampleKernel: the
// whole order by one device-wide radix sort (PrepareSortKernel, then cub, then
// UnpackSortKeysKernel), or a row's first K by in-block sorts (TopKSelectKernel). Included by
// sampling.cu only, which enqueues them (SampleInto).
#pragma once

#include <cub/cub.cuh>

#include "kernels/cuda/common.cuh"

namespace corolla::cuda {
namespace {

constexpr int kThreads = 256;

// A row's sampling parameters on the device (SamplingParams and its step).

struct RowParams {
  float temperature;
  int top_k;
  float top_p;
  float min_p;
  unsigned long long seed;
  unsigned long long step;
};

__device__ __forceinline__ float LoadLogit(const void* logits, bool is_bf16, int64_t i) {
  return is_bf16 ? __bfloat162float(static_cast<const bf16_t*>(logits)[i])
                 : static_cast<const float*>(logits)[i];
}

struct PrepParams {
  const void* logits;
  bool is_bf16;
  int64_t vocab, batch;
  uint64_t* keys;  // [batch * vocab] composite sort keys (SortKeyBits)
  int32_t* ids;
};

// A logit as a sort key: NaN -> -inf and -0 -> +0 (the CPU compares them as equal).
__device__ __forceinline__ float SortKey(float v) {
  if (v != v) v = -INFINITY;
  if (v == 0.f) v = 0.f;
  return v;
}

// One ascending radix sort over every row at once orders by (row, logit descending), ties kept
// in id order by the sort's stability: the row in the high 32 bits, below it the key's bits
// made unsigned-orderable and inverted.
__device__ __forceinline__ uint64_t SortKeyBits(int64_t row, float key) {
  uint32_t u = __float_as_uint(key);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ascending as the floats are
  return (static_cast<uint64_t>(row) << 32) | static_cast<uint32_t>(~u);
}

__device__ __forceinline__ float KeyFromBits(uint64_t bits) {
  const uint32_t u = ~static_cast<uint32_t>(bits);
  return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}

// Sort keys and, as values, token ids.
__global__ void PrepareSortKernel(const __grid_constant__ PrepParams p) {
  const int64_t n = p.batch * p.vocab;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    p.keys[i] = SortKeyBits(i / p.vocab, SortKey(LoadLogit(p.logits, p.is_bf16, i)));
    p.ids[i] = static_cast<int32_t>(i % p.vocab);
  }
}

// The sorted composite keys back to floats, for SampleKernel.
__global__ void UnpackSortKeysKernel(const uint64_t* bits, float* keys, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    keys[i] = KeyFromBits(bits[i]);
}

// Top-k rows need only the first K entries of the sampling order (top-p and min-p are prefixes
// within them), and those come without sorting the vocabulary: each CTA sorts a chunk of
// kSelectChunk entries in shared memory and keeps its first K; rounds repeat over the kept
// candidates, (kSelectChunk / K) chunks' worth a CTA, until one CTA holds the row. Qwen3's
// top_k 20 over 151936 logits: 75 CTAs a row, then one. A stable sort of entries in id order
// keeps ties in id order, the order the full sort gives the vocabulary. On an H200
// (Qwen3-30B-A3B at concurrency 1, session 28) the sampled step costs ~0.03 ms over a greedy one
// this way, ~0.11 with the full sort above (Tuning().sample_top_k_select).
constexpr int kSelectItems = 8;
constexpr int kSelectChunk = kThreads * kSelectItems;
// Larger K take the full sort (K = 256 already needs four rounds over a 151936 vocabulary).
constexpr int kSelectMaxK = 256;

struct SelectParams {
  const void* logits;  // round 0 reads the logits [batch, vocab] ...
  bool is_bf16;
  const float* in_keys;  // ... later rounds the kept candidates [batch, n_in] (null in round 0)
  const int32_t* in_ids;
  int64_t n_in;   // entries a row
  int64_t chunk;  // entries a CTA (a multiple of k after round 0)
  int k;
  const RowParams* rows;
  float* out_keys;  // [batch, gridDim.x * k]: each chunk's first k, in order
  int32_t* out_ids;
};

using BlockSortPairs = cub::BlockRadixSort<float, kThreads, kSelectItems, int32_t>;

// grid (chunks, batch): chunk blockIdx.x of sampled row blockIdx.y, sorted, its first k kept.
__global__ void __launch_bounds__(kThreads)
    TopKSelectKernel(const __grid_constant__ SelectParams p) {
  __shared__ typename BlockSortPairs::TempStorage temp;
  const int64_t b = blockIdx.y;
  if (!(p.rows[b].temperature > 0.f)) return;  // greedy: ArgmaxSliceKernel's row
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * p.chunk;
  const int64_t end = min(begin + p.chunk, p.n_in);
  float keys[kSelectItems];
  int32_t ids[kSelectItems];
  // Blocked: thread t holds entries t * kSelectItems + j, so the sort's stable order is the
  // entries' order. Past the end: -inf after every real entry (stability keeps it there), and
  // only the row's last chunk of round 0 can hold fewer than k real entries.
#pragma unroll
  for (int j = 0; j < kSelectItems; ++j) {
    const int64_t i = begin + threadIdx.x * kSelectItems + j;
    if (i >= end) {
      keys[j] = -INFINITY;
      ids[j] = 0x7fffffff;
    } else if (p.in_keys == nullptr) {
      keys[j] = SortKey(LoadLogit(p.logits, p.is_bf16, b * p.n_in + i));
      ids[j] = static_cast<int32_t>(i);
    } else {
      keys[j] = p.in_keys[b * p.n_in + i];
      ids[j] = p.in_ids[b * p.n_in + i];
    }
  }
  BlockSortPairs(temp).SortDescending(keys, ids);
  const int64_t out = (b * gridDim.x + blockIdx.x) * p.k;
#pragma unroll
  for (int j = 0; j < kSelectItems; ++j) {
    const int rank = threadIdx.x * kSelectItems + j;
    if (rank < p.k) {
      p.out_keys[out + rank] = keys[j];
      p.out_ids[out + rank] = ids[j];
    }
  }
}

}  // namespace
}  // namespace corolla::cuda
