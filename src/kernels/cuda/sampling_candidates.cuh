// A nucleus row's candidates (the entries of its runs, sampling_nucleus.cuh) as 64-bit keys whose
// ascending order is the sampling order (logit descending, then id), the in-block radix sorts
// and shared memory of a tile's walk (SampleTile, up to 4096 entries) and the LSD sort in global
// memory past a tile. Included by sampling_nucleus.cuh only.
#pragma once

#include <cub/cub.cuh>

#include "kernels/cuda/sampling_walk.cuh"

namespace corolla::cuda {
namespace {

constexpr int kNucleusItems = 16;
constexpr int kNucleusTile = kThreads * kNucleusItems;  // entries one in-block sort takes

// An entry's sort key: ascending order is the sampling order (logit descending, then id).
__device__ __forceinline__ uint64_t CandidateKey(float key, int id, int id_bits) {
  uint32_t u = __float_as_uint(SortKey(key));
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ascending as the floats are
  return (static_cast<uint64_t>(~u) << id_bits) | static_cast<uint32_t>(id);
}

__device__ __forceinline__ float CandidateLogit(uint64_t c, int id_bits) {
  const uint32_t u = ~static_cast<uint32_t>(c >> id_bits);
  return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}

__device__ __forceinline__ int CandidateId(uint64_t c, int id_bits) {
  return static_cast<int>(c & ((uint64_t{1} << id_bits) - 1));
}

// Weights over sorted candidates, as Weights over sorted keys.
struct CandidateWeights {
  const uint64_t* keys;
  float max, temperature;
  int id_bits;
  __device__ float operator()(int64_t i) const {
    return WeightOf(CandidateLogit(keys[i], id_bits), max, temperature);
  }
};

// 6-bit digits: a tile sorts on its logits' varying bits (~20 for a flat fp32 row) in 4 passes.
constexpr int kNucleusRadixBits = 6;
using NucleusTileSort =
    cub::BlockRadixSort<uint64_t, kThreads, kNucleusItems, cub::NullType, kNucleusRadixBits>;
constexpr int kNucleusSmallItems = 4;  // up to 1024 entries (most rows): a quarter of the work
using NucleusSmallSort =
    cub::BlockRadixSort<uint64_t, kThreads, kNucleusSmallItems, cub::NullType, kNucleusRadixBits>;

struct OrOp {
  __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a | b; }
};

struct NucleusSortSmem {
  union {
    typename NucleusTileSort::TempStorage sort;
    typename NucleusSmallSort::TempStorage small;
    double prefix[PaddedSize(kNucleusTile)];  // a sorted tile's inclusive weight sums (SampleTile)
    int32_t tie_ids[kNucleusTile];            // then the ids of the pick's tie group
    struct {
      uint64_t keys[kThreads];    // as gathered
      uint64_t sorted[kThreads];  // in sampling order
      double prefix[PaddedSize(kThreads)];
    } ranked;  // SampleRanked's
  };
  typename cub::BlockReduce<long long, kThreads>::TempStorage reduce_ll;
  typename cub::BlockReduce<uint64_t, kThreads>::TempStorage reduce;
  uint64_t varying;
  typename cub::BlockScan<int, kThreads>::TempStorage scan;
  typename BlockScan::TempStorage scan_d;
  typename BlockReduceI::TempStorage reduce_i;
  int pick, pick_id;
  uint64_t pick_logit;     // the pick's key above the id bits (SampleTile's ties)
  long long before_group;  // entries before the pick's tie group, and in it (packed)
  int n_listed;
  int digits[256], offsets[256], tile_start[256];
};

// The number of low bits in which the keys k (n of them over the block, blocked) differ from
// `first` (the row's first key): the width the sort needs. In every thread.
template <int kItemsT>
__device__ int VaryingBits(const uint64_t (&k)[kItemsT], int n, uint64_t first,
                           NucleusSortSmem& sm) {
  uint64_t diff = 0;
#pragma unroll
  for (int j = 0; j < kItemsT; ++j)
    if (threadIdx.x * kItemsT + j < n) diff |= k[j] ^ first;
  diff = cub::BlockReduce<uint64_t, kThreads>(sm.reduce).Reduce(diff, OrOp());
  if (threadIdx.x == 0) sm.varying = diff;
  __syncthreads();
  return sm.varying == 0 ? 0 : 64 - __clzll(static_cast<long long>(sm.varying));
}

// The n candidates at keys (more than a tile; SampleTile sorts up to one in registers) in
// ascending order, in keys or alt (returned), sorted on the low bits up to the highest in which
// two differ (a row's candidates share a narrow range of logits, so their float bits agree high
// up): one CTA's LSD radix sort in global memory, 8 bits a pass, each tile of the source sorted on
// the pass's digit in shared memory (stable) and scattered behind the digit's earlier entries.
__device__ const uint64_t* SortLargeCandidates(uint64_t* keys, uint64_t* alt, int n,
                                               NucleusSortSmem& sm) {
  const uint64_t first = keys[0];
  uint64_t diff = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) diff |= keys[i] ^ first;
  diff = cub::BlockReduce<uint64_t, kThreads>(sm.reduce).Reduce(diff, OrOp());
  if (threadIdx.x == 0) sm.varying = diff;
  __syncthreads();
  const int bits = sm.varying == 0 ? 0 : 64 - __clzll(static_cast<long long>(sm.varying));
  if (bits == 0) return keys;  // one entry
  uint64_t k[kNucleusItems];
  uint64_t* src = keys;
  uint64_t* dst = alt;
  for (int shift = 0; shift < bits; shift += 8) {
    auto digit = [shift](uint64_t key) { return static_cast<int>((key >> shift) & 0xffu); };
    sm.digits[threadIdx.x] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += kThreads) atomicAdd(&sm.digits[digit(src[i])], 1);
    __syncthreads();
    int offset;
    cub::BlockScan<int, kThreads>(sm.scan).ExclusiveSum(sm.digits[threadIdx.x], offset);
    sm.offsets[threadIdx.x] = offset;
    __syncthreads();
    for (int base = 0; base < n; base += kNucleusTile) {
      const int n_tile = min(kNucleusTile, n - base);
#pragma unroll
      for (int j = 0; j < kNucleusItems; ++j) {
        const int i = threadIdx.x * kNucleusItems + j;
        k[j] = i < n_tile ? src[base + i] : ~uint64_t{0};  // padding: digit 255, after the real
      }
      sm.digits[threadIdx.x] = 0;
      NucleusTileSort(sm.sort).Sort(k, shift, min(shift + 8, 64));  // synchronises
#pragma unroll
      for (int j = 0; j < kNucleusItems; ++j)
        if (threadIdx.x * kNucleusItems + j < n_tile) atomicAdd(&sm.digits[digit(k[j])], 1);
      __syncthreads();
      int start;
      cub::BlockScan<int, kThreads>(sm.scan).ExclusiveSum(sm.digits[threadIdx.x], start);
      sm.tile_start[threadIdx.x] = start;
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kNucleusItems; ++j) {
        const int r = threadIdx.x * kNucleusItems + j;
        if (r < n_tile) {
          const int d = digit(k[j]);
          dst[sm.offsets[d] + r - sm.tile_start[d]] = k[j];
        }
      }
      __syncthreads();
      sm.offsets[threadIdx.x] += sm.digits[threadIdx.x];
      __syncthreads();
    }
    uint64_t* const tmp = src;
    src = dst;
    dst = tmp;
  }
  return src;
}

}  // namespace
}  // namespace corolla::cuda
