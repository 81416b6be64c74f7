// Block-wide pieces of sampling.cu's row walks, shared with sampling_nucleus.cuh: the draw's
// uniform (Philox4x32-10, the CPU's arithmetic), the greedy rows' best (value, id), a row's
// weights exp((l - max) / T) over keys in sampling order, and one CTA's sums and searches over
// them. Included by sampling.cu only (after sampling_order.cuh).
#pragma once

#include <cub/cub.cuh>

#include "kernels/cuda/sampling_order.cuh"

namespace corolla::cuda {
namespace {

constexpr int kItems = 8;

__device__ float UniformFromSeedDevice(uint64_t seed, uint64_t step) {
  uint32_t c0 = static_cast<uint32_t>(step), c1 = static_cast<uint32_t>(step >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint32_t lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);
    const uint32_t lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
  }
  return static_cast<float>(c0 >> 8) * 0x1p-24f;
}

// (v, i) beats (best, best_id): larger value, then lower id; NaN never wins.
__device__ __forceinline__ void KeepBest(float v, int i, float& best, int& best_id) {
  if (v > best || (v == best && i < best_id)) {
    best = v;
    best_id = i;
  }
}

// The block's best (value, id) of every thread's (best, best_id), in thread 0 (no id: INT_MAX).
__device__ void BlockBest(float& best, int& best_id) {
  for (int o = 16; o > 0; o >>= 1)
    KeepBest(__shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, best_id, o), best,
             best_id);
  __shared__ float vals[kThreads / 32];
  __shared__ int ids[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    vals[warp] = best;
    ids[warp] = best_id;
  }
  __syncthreads();
  if (warp == 0) {
    best = lane < kThreads / 32 ? vals[lane] : -INFINITY;
    best_id = lane < kThreads / 32 ? ids[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1)
      KeepBest(__shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, best_id, o),
               best, best_id);
  }
}

// The best (value, id) of a CTA's logits v, entry j of thread t being id begin + j x kThreads + t,
// written by thread 0 to *val and *id (NaN never wins; ties go to the lowest id).
template <int kItemsT>
__device__ void ChunkBest(const float (&v)[kItemsT], int64_t begin, float* val, int32_t* id) {
  float best = -INFINITY;
  int best_id = 0x7fffffff;
#pragma unroll
  for (int j = 0; j < kItemsT; ++j)  // ids ascend with j: strict > keeps the lowest of ties
    if (v[j] > best) {
      best = v[j];
      best_id = static_cast<int>(begin + j * kThreads + threadIdx.x);
    }
  BlockBest(best, best_id);
  if (threadIdx.x == 0) {
    *val = best;
    *id = best_id;
  }
}

// A greedy row's token from the argmax slices' bests [slices] (sampling.cu's
// ArgmaxSliceKernel): the block's best, in thread 0; 0 when no logit is finite or +inf.
__device__ int GreedyFromSlices(const float* slice_val, const int32_t* slice_id, int slices) {
  float best = -INFINITY;
  int best_id = 0x7fffffff;
  for (int i = threadIdx.x; i < slices; i += kThreads)
    KeepBest(slice_val[i], slice_id[i], best, best_id);
  BlockBest(best, best_id);
  return best_id == 0x7fffffff ? 0 : best_id;
}

using BlockScan = cub::BlockScan<double, kThreads>;
using BlockReduceD = cub::BlockReduce<double, kThreads>;
using BlockReduceI = cub::BlockReduce<int, kThreads>;

struct MinOp {
  __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};

struct SampleSmem {
  union {
    typename BlockScan::TempStorage scan;
    typename BlockReduceD::TempStorage reduce_d;
    typename BlockReduceI::TempStorage reduce_i;
  };
  double carry;
  int found;
  int n_positive, n_floor;
};

// A logit's weight exp((v - max) / T): 0 for -inf / NaN; with +inf logits, 1 for those only.
__device__ __forceinline__ float WeightOf(float v, float max, float temperature) {
  if (max == INFINITY) return v == INFINITY ? 1.f : 0.f;
  if (!(v > -INFINITY)) return 0.f;
  return expf((v - max) / temperature);
}

// The smallest positive weight; min-p's floor (the top token's weight is 1, so a floor <= 1 keeps
// it), or the positive weights' without min_p.
constexpr float kMinWeight = 1.401298464e-45f;
__device__ __forceinline__ float MinPFloor(float min_p) {
  return min_p > 0.f ? fmaxf(fminf(min_p, 1.f), kMinWeight) : kMinWeight;
}

struct Weights {
  const float* keys;
  float max, temperature;
  __device__ float operator()(int64_t i) const { return WeightOf(keys[i], max, temperature); }
};

template <typename W>
__device__ double BlockSumWeights(const W& w, int64_t n, SampleSmem& sm) {
  double local = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) local += w(i);
  const double total = BlockReduceD(sm.reduce_d).Sum(local);
  __syncthreads();
  if (threadIdx.x == 0) sm.carry = total;
  __syncthreads();
  const double r = sm.carry;
  __syncthreads();
  return r;
}

// First j in [0, n) whose inclusive prefix sum of weights exceeds `threshold` (or reaches it
// when !strict); n if none. *sum_before returns the sum of the weights before j (all n if none).
template <typename W>
__device__ int64_t FirstPrefix(const W& w, int64_t n, double threshold, bool strict, SampleSmem& sm,
                               double* sum_before) {
  if (threadIdx.x == 0) sm.carry = 0.0;
  __syncthreads();
  for (int64_t base = 0; base < n; base += kThreads * kItems) {
    double vals[kItems];
    double local = 0.0;
    const int64_t first = base + threadIdx.x * kItems;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      vals[i] = first + i < n ? static_cast<double>(w(first + i)) : 0.0;
      local += vals[i];
    }
    double prefix, total;
    BlockScan(sm.scan).ExclusiveSum(local, prefix, total);
    __syncthreads();
    const double carry = sm.carry;
    double s = carry + prefix;
    int hit = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const double next = s + vals[i];
      if (hit == 0x7fffffff && first + i < n && (strict ? next > threshold : next >= threshold))
        hit = i;
      s = next;
    }
    const int local_hit =
        hit == 0x7fffffff ? 0x7fffffff : static_cast<int>(threadIdx.x * kItems + hit);
    const int block_hit = BlockReduceI(sm.reduce_i).Reduce(local_hit, MinOp());
    if (threadIdx.x == 0) sm.found = block_hit;
    __syncthreads();
    const int f = sm.found;
    if (f != 0x7fffffff) {
      // The sum before the hit: the hitting thread knows it; recompute from its prefix.
      if (threadIdx.x == f / kItems) {
        double sb = carry + prefix;
        for (int i = 0; i < f % kItems; ++i) sb += vals[i];
        sm.carry = sb;
      }
      __syncthreads();
      *sum_before = sm.carry;
      __syncthreads();
      return base + f;
    }
    if (threadIdx.x == 0) sm.carry = carry + total;
    __syncthreads();
  }
  *sum_before = sm.carry;
  __syncthreads();
  return n;
}

// First index in [0, n) with w(i) < floor (w is non-increasing along the sorted order).
template <typename W>
__device__ int64_t FirstBelow(const W& w, int64_t n, float floor) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (w(mid) >= floor)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Inclusive sums in shared memory written blocked (thread t the entries t x k ..), one pad entry
// after every 16 so that a warp's stores of its k-th entries fall in different banks (unpadded,
// k = 16 puts all 32 in one bank). Entry i of the sums from `base` on.
constexpr int PaddedSize(int n) { return n + n / 16; }
struct PaddedSums {
  const double* p;
  int base;
  __device__ double operator[](int64_t i) const {
    const int64_t j = base + i;
    return p[j + j / 16];
  }
};
__device__ __forceinline__ void StorePadded(double* p, int i, double v) { p[i + i / 16] = v; }

// First j in [0, n) with sums[j] > threshold (>= when !strict), n if none: FirstPrefix over
// inclusive prefix sums already formed (non-decreasing, weights are >= 0). Sums: a pointer or
// PaddedSums.
template <typename Sums>
__device__ int64_t FirstSumPast(const Sums& sums, int64_t n, double threshold, bool strict) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (strict ? sums[mid] > threshold : sums[mid] >= threshold)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

}  // namespace
}  // namespace corolla::cuda
