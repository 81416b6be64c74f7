// Sampling without ordering the vocabulary, for steps whose sampled rows name no top_k (top-p,
// min-p or the temperature alone: DeepSeek-V3's generation_config, or a request that sets
// top_p only). The full sort ordered all of every row to find two places in it: where top-p /
// min-p cut the kept set, and where the draw lands. Both are prefixes of the sampling order,
// and a histogram of the row's weights by x = (max - l) / T (a logit's distance below the max,
// in units of T; 128 bins a unit, the last bin takes every x >= 32) says which bins hold them:
//   NucleusHistKernel   each bin's mass and count, many CTAs a row;
//   NucleusPlanKernel   run B: the bins where the cut can fall (the mass reaching top_p x Z,
//                       the bin of the min-p floor; a neighbour too where a sum lies within
//                       1e-9 x Z of its limit); run A: the bins where the draw u x kept can
//                       fall, the kept mass lying between the mass before B and through it;
//   NucleusGatherKernel the entries of runs A and B (typically a few hundred a row);
//   NucleusSampleKernel one CTA a row sorts them (by logit descending, then id), walks B to
//                       the cut from the mass before it, then A (or B) to the draw.
// x is monotone in the logit (correctly rounded subtraction and division), so a bin is a
// contiguous piece of the sampling order and ties share one. The tokens are those of the full
// sort; the sums differ in the last bits (the bins' masses through fixed point and atomics), as
// the known deviations in sampling.cu say. A row whose runs hold more than a tile (4096 entries:
// logits flat within ~1/64 of T: all equal, or a temperature far above the spread) sorts them with
// one CTA in global memory: slow, exact. Included by sampling.cu only, which enqueues the kernels
// (SampleInto).
#pragma once

#include <cub/cub.cuh>

#include "kernels/cuda/sampling_walk.cuh"

namespace corolla::cuda {
namespace {

constexpr int kNucleusBins = 4096;
constexpr float kNucleusBinsPerUnit = 128.f;
constexpr int kNucleusItems = 16;
constexpr int kNucleusChunk = kThreads * kNucleusItems;  // entries a histogram / gather CTA
constexpr int kNucleusTile = kThreads * kNucleusItems;   // entries one in-block sort takes

struct NucleusPlan {
  float max;              // the row's largest logit; -inf: nothing to sample (token 0)
  int cut;                // top-p or min-p cut the kept set inside run B
  int a_lo, a_hi;         // run A's bins (none: a_lo > a_hi)
  int b_lo, b_hi;         // run B's bins (none without a cut)
  int n_a, n_b;           // entries in the runs
  double base_a, base_b;  // mass of the bins before each run
  double z;               // the row's mass
};

struct NucleusParams {
  const void* logits;
  bool is_bf16;
  int64_t vocab;
  const RowParams* rows;
  const float* slice_val;  // ArgmaxSliceKernel's bests of every row [batch, slices]
  const int32_t* slice_id;
  int slices;
  double* bin_mass;   // [batch, kNucleusBins], zeroed
  int* bin_count;     // [batch, kNucleusBins], zeroed; the plan leaves inclusive counts there
  int* cursor;        // [batch], zeroed: entries gathered
  NucleusPlan* plan;  // [batch]
  uint64_t* cand;     // [batch, vocab]: the runs' entries as CandidateKey
  uint64_t* alt;      // [batch, vocab]: the large sort's other buffer
  int id_bits;        // bits of the largest id
  int32_t* out;
};

struct MaxF {
  __device__ float operator()(float a, float b) const { return a > b ? a : b; }
};
struct MaxI {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};

// The row's largest logit from its slices' bests (never NaN), in every thread.
__device__ float BlockRowMax(const float* slice_val, int slices) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float result;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < slices; i += kThreads) m = MaxF()(m, slice_val[i]);
  m = Reduce(temp).Reduce(m, MaxF());
  if (threadIdx.x == 0) result = m;
  __syncthreads();
  return result;
}

// An entry's weight and bin; false for weight 0 (-inf, NaN, underflow, or finite beside +inf).
// The weight is WeightOf's (sampling_walk.cuh) to the bit.
__device__ __forceinline__ bool NucleusEntry(float v, float max, float t, float& w, int& bin) {
  if (max == INFINITY) {
    if (v != INFINITY) return false;
    w = 1.f;
    bin = 0;
    return true;
  }
  if (!(v > -INFINITY)) return false;
  const float neg = __fdiv_rn(__fsub_rn(v, max), t);
  w = expf(neg);
  if (!(w > 0.f)) return false;
  const float x = __fmul_rn(-neg, kNucleusBinsPerUnit);
  bin = x < static_cast<float>(kNucleusBins - 1) ? static_cast<int>(x) : kNucleusBins - 1;
  return true;
}

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

// Row b's logits begin + j * kThreads + threadIdx.x (-inf past the vocabulary), the entries a
// thread of a histogram / gather CTA takes.
__device__ __forceinline__ void LoadChunk(const NucleusParams& p, int64_t b, int64_t begin,
                                          float (&v)[kNucleusItems]) {
#pragma unroll
  for (int j = 0; j < kNucleusItems; ++j) {
    const int64_t i = begin + j * kThreads + threadIdx.x;
    v[j] = i < p.vocab ? LoadLogit(p.logits, p.is_bf16, b * p.vocab + i) : -INFINITY;
  }
}

// grid (chunks, batch): the bins of chunk blockIdx.x of sampled row blockIdx.y, added to the
// row's. The last bin (most of a peaked row's entries) sums in registers: no contention.
// A CTA sums its bins' weights in 2^-51 fixed point, two 32-bit words a bin (native shared-memory
// atomics, the carry by hand): doubles took compare-and-swap loops, 11.7 us a batch-1 histogram
// against 7.9 (H200, ncu; batch 64 64.8 against 45.7). Each weight (<= 1) loses < 2^-51, so a
// row's sums stay within 152k x 2^-51 < 1e-10 of its mass Z of the exact ones, inside the plan's
// 1e-9 x Z margins; at most 4096 weights a CTA keep a bin's sum under 2^63.
__global__ void __launch_bounds__(kThreads)
    NucleusHistKernel(const __grid_constant__ NucleusParams p) {
  const int64_t b = blockIdx.y;
  if (!(p.rows[b].temperature > 0.f)) return;
  __shared__ unsigned fixed[2][kNucleusBins];    // low words, high words
  __shared__ unsigned count2[kNucleusBins / 2];  // two 16-bit counts a word: <= 4096 entries a CTA
  __shared__ typename BlockReduceD::TempStorage reduce_d;
  __shared__ typename BlockReduceI::TempStorage reduce_i;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kNucleusChunk;
  float v[kNucleusItems];
  LoadChunk(p, b, begin, v);  // out before the max's loads
  for (int i = threadIdx.x; i < kNucleusBins; i += kThreads) fixed[0][i] = fixed[1][i] = 0;
  for (int i = threadIdx.x; i < kNucleusBins / 2; i += kThreads) count2[i] = 0;
  const float max = BlockRowMax(p.slice_val + b * p.slices, p.slices);  // synchronises
  if (max == -INFINITY) return;
  const float t = p.rows[b].temperature;
  double tail = 0.0;
  int tail_n = 0;
#pragma unroll
  for (int j = 0; j < kNucleusItems; ++j) {
    float w;
    int bin;
    if (!NucleusEntry(v[j], max, t, w, bin)) continue;
    if (bin == kNucleusBins - 1) {
      tail += w;
      ++tail_n;
    } else {
      const unsigned long long q = static_cast<unsigned long long>(static_cast<double>(w) * 0x1p51);
      const unsigned lo = static_cast<unsigned>(q);
      const unsigned old = atomicAdd(&fixed[0][bin], lo);
      atomicAdd(&fixed[1][bin], static_cast<unsigned>(q >> 32) + (old + lo < old ? 1u : 0u));
      atomicAdd(&count2[bin / 2], 1u << (16 * (bin % 2)));
    }
  }
  tail = BlockReduceD(reduce_d).Sum(tail);
  tail_n = BlockReduceI(reduce_i).Sum(tail_n);
  __syncthreads();
  double* row_mass = p.bin_mass + b * kNucleusBins;
  int* row_count = p.bin_count + b * kNucleusBins;
  for (int i = threadIdx.x; i < kNucleusBins - 1; i += kThreads) {
    const int c = static_cast<int>((count2[i / 2] >> (16 * (i % 2))) & 0xffffu);
    if (c == 0) continue;
    const unsigned long long q = (static_cast<unsigned long long>(fixed[1][i]) << 32) | fixed[0][i];
    atomicAdd(&row_mass[i], static_cast<double>(q) * 0x1p-51);
    atomicAdd(&row_count[i], c);
  }
  if (threadIdx.x == 0 && tail_n > 0) {
    atomicAdd(&row_mass[kNucleusBins - 1], tail);
    atomicAdd(&row_count[kNucleusBins - 1], tail_n);
  }
}

// grid (batch): sampled row blockIdx.x's runs (NucleusPlan). The bins' inclusive sums go to
// shared memory (mass) and back over bin_count (counts), then thread 0 searches them.
__global__ void __launch_bounds__(kThreads)
    NucleusPlanKernel(const __grid_constant__ NucleusParams p) {
  const int64_t b = blockIdx.x;
  if (!(p.rows[b].temperature > 0.f)) return;
  const RowParams rp = p.rows[b];
  __shared__ double cum[kNucleusBins];
  __shared__ typename BlockScan::TempStorage scan_d;
  __shared__ typename cub::BlockScan<int, kThreads>::TempStorage scan_i;
  __shared__ typename BlockReduceI::TempStorage reduce_i;
  __shared__ int last_shared;
  NucleusPlan plan{};
  plan.max = BlockRowMax(p.slice_val + b * p.slices, p.slices);
  plan.a_lo = plan.b_lo = 1;
  if (plan.max == -INFINITY) {
    if (threadIdx.x == 0) p.plan[b] = plan;
    return;
  }
  constexpr int kPer = kNucleusBins / kThreads;
  double* row_mass = p.bin_mass + b * kNucleusBins;
  int* row_count = p.bin_count + b * kNucleusBins;
  double m[kPer];
  int c[kPer];
  double local = 0.0;
  int local_n = 0, last = -1;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int bin = threadIdx.x * kPer + j;
    m[j] = row_mass[bin];
    c[j] = row_count[bin];
    local += m[j];
    local_n += c[j];
    if (c[j] > 0) last = bin;
  }
  double before;
  int before_n;
  BlockScan(scan_d).ExclusiveSum(local, before);
  cub::BlockScan<int, kThreads>(scan_i).ExclusiveSum(local_n, before_n);
  last = BlockReduceI(reduce_i).Reduce(last, MaxI());
  if (threadIdx.x == 0) last_shared = last;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int bin = threadIdx.x * kPer + j;
    before += m[j];
    before_n += c[j];
    cum[bin] = before;
    row_count[bin] = before_n;  // this row's counts are read by this thread only, above
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  last = max(last_shared, 0);
  const double z = cum[kNucleusBins - 1];
  const double delta = 1e-9 * z;
  // The first bin in [0, last] whose inclusive sum passes x (>= x, or > x when strict); last if
  // none.
  auto first_past = [&](double x, bool strict) {
    return static_cast<int>(min(FirstSumPast(cum, last + 1, x, strict), int64_t{last}));
  };
  auto mass_before = [&](int bin) { return bin > 0 ? cum[bin - 1] : 0.0; };
  auto count_in = [&](int lo, int hi) {
    return lo > hi ? 0 : row_count[hi] - (lo > 0 ? row_count[lo - 1] : 0);
  };
  const bool top_p = rp.top_p < 1.f;
  const bool min_p = rp.min_p > 0.f;
  plan.cut = top_p || min_p;
  plan.z = z;
  plan.b_lo = 1;
  plan.b_hi = 0;
  if (plan.cut) {
    int c_lo = last, c_hi = last, f_lo = last, f_hi = last;
    if (top_p) {
      const double limit = static_cast<double>(rp.top_p) * z;
      c_lo = first_past(limit - delta, false);
      c_hi = first_past(limit + delta, false);
    }
    if (min_p) {
      // Weights >= floor: x <= -log(floor), give or take logf's and expf's rounding (~1e-5 of
      // a unit at x = 100), far inside the 0.05 of a bin either side taken here.
      const float floor = MinPFloor(rp.min_p);
      const float x = -logf(floor) * kNucleusBinsPerUnit;
      auto bin_of = [](float y) {
        return y < static_cast<float>(kNucleusBins - 1) ? static_cast<int>(fmaxf(y, 0.f))
                                                        : kNucleusBins - 1;
      };
      f_lo = min(bin_of(x - 0.05f), last);
      f_hi = min(bin_of(x + 0.05f), last);
    }
    if (top_p && min_p) {
      if (f_hi < c_lo) {
        c_lo = f_lo;
        c_hi = f_hi;
      } else if (c_hi >= f_lo) {
        c_lo = min(c_lo, f_lo);
        c_hi = max(c_hi, f_hi);
      }
    } else if (min_p) {
      c_lo = f_lo;
      c_hi = f_hi;
    }
    plan.b_lo = c_lo;
    plan.b_hi = c_hi;
  }
  // The kept mass lies in [k_lo, k_hi], so the draw u x kept in u x that.
  const double k_lo = plan.cut ? mass_before(plan.b_lo) : z;
  const double k_hi = plan.cut ? cum[plan.b_hi] : z;
  const double u = static_cast<double>(UniformFromSeedDevice(rp.seed, rp.step));
  plan.a_lo = first_past(u * k_lo - delta, true);
  plan.a_hi = first_past(u * k_hi + delta, true);
  if (plan.cut) {
    plan.a_hi = min(plan.a_hi, plan.b_hi);
    if (plan.a_hi + 1 >= plan.b_lo) {  // touching: one run, B, holds both
      plan.b_lo = min(plan.b_lo, plan.a_lo);
      plan.a_lo = 1;
      plan.a_hi = 0;
    }
  }
  plan.n_a = count_in(plan.a_lo, plan.a_hi);
  plan.n_b = count_in(plan.b_lo, plan.b_hi);
  plan.base_a = plan.a_lo <= plan.a_hi ? mass_before(plan.a_lo) : 0.0;
  plan.base_b = plan.b_lo <= plan.b_hi ? mass_before(plan.b_lo) : 0.0;
  p.plan[b] = plan;
}

// grid (chunks, batch): the entries of chunk blockIdx.x of row blockIdx.y in its runs, appended
// (a warp's at once) to the row's candidates in any order: the sort key holds the id.
__global__ void __launch_bounds__(kThreads)
    NucleusGatherKernel(const __grid_constant__ NucleusParams p) {
  const int64_t b = blockIdx.y;
  if (!(p.rows[b].temperature > 0.f)) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kNucleusChunk;
  float v[kNucleusItems];
  LoadChunk(p, b, begin, v);  // out before the plan's loads
  const NucleusPlan plan = p.plan[b];
  if (plan.max == -INFINITY) return;
  const float t = p.rows[b].temperature;
  const int lane = threadIdx.x % 32;
  uint64_t* out = p.cand + b * p.vocab;
#pragma unroll
  for (int j = 0; j < kNucleusItems; ++j) {
    float w;
    int bin;
    const bool take =
        NucleusEntry(v[j], plan.max, t, w, bin) &&
        ((bin >= plan.a_lo && bin <= plan.a_hi) || (bin >= plan.b_lo && bin <= plan.b_hi));
    const unsigned mask = __ballot_sync(0xffffffffu, take);
    if (mask == 0) continue;
    int base = 0;
    if (lane == __ffs(mask) - 1) base = atomicAdd(&p.cursor[b], __popc(mask));
    base = __shfl_sync(0xffffffffu, base, __ffs(mask) - 1);
    if (take) {
      const int id = static_cast<int>(begin + j * kThreads + threadIdx.x);
      out[base + __popc(mask & ((1u << lane) - 1))] = CandidateKey(v[j], id, p.id_bits);
    }
  }
}

using NucleusTileSort = cub::BlockRadixSort<uint64_t, kThreads, kNucleusItems>;
constexpr int kNucleusSmallItems = 4;  // up to 1024 entries (most rows): a quarter of the work
using NucleusSmallSort = cub::BlockRadixSort<uint64_t, kThreads, kNucleusSmallItems>;

struct OrOp {
  __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a | b; }
};

struct NucleusSortSmem {
  union {
    typename NucleusTileSort::TempStorage sort;
    typename NucleusSmallSort::TempStorage small;
    typename cub::BlockReduce<uint64_t, kThreads>::TempStorage reduce;
  };
  uint64_t varying;
  typename cub::BlockScan<int, kThreads>::TempStorage scan;
  int digits[256], offsets[256], tile_start[256];
};

// keys[0, n) sorted in place by one in-block sort of kItemsT entries a thread (n <= its tile).
template <int kItemsT, typename Sort>
__device__ void SortTileInPlace(uint64_t* keys, int n, int bits, typename Sort::TempStorage& temp) {
  uint64_t k[kItemsT];
#pragma unroll
  for (int j = 0; j < kItemsT; ++j) {
    const int i = threadIdx.x * kItemsT + j;
    k[j] = i < n ? keys[i] : ~uint64_t{0};
  }
  Sort(temp).Sort(k, 0, bits);
#pragma unroll
  for (int j = 0; j < kItemsT; ++j) {
    const int i = threadIdx.x * kItemsT + j;
    if (i < n) keys[i] = k[j];
  }
  __syncthreads();
}

// The n candidates at keys in ascending order, in keys or alt (returned), sorted on the low bits
// up to the highest in which two differ (a row's candidates share a narrow range of logits, so
// their float bits agree high up). Up to a tile: one in-block sort (of 1024 or 4096 entries).
// More: one CTA's LSD radix sort in global memory, 8 bits a pass, each tile of the source sorted
// on the pass's digit in shared memory (stable) and scattered behind the digit's earlier entries.
__device__ const uint64_t* SortCandidates(uint64_t* keys, uint64_t* alt, int n,
                                          NucleusSortSmem& sm) {
  const uint64_t first = keys[0];
  uint64_t diff = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) diff |= keys[i] ^ first;
  diff = cub::BlockReduce<uint64_t, kThreads>(sm.reduce).Reduce(diff, OrOp());
  if (threadIdx.x == 0) sm.varying = diff;
  __syncthreads();
  const int bits = sm.varying == 0 ? 0 : 64 - __clzll(static_cast<long long>(sm.varying));
  if (bits == 0) return keys;  // one entry
  if (n <= kThreads * kNucleusSmallItems) {
    SortTileInPlace<kNucleusSmallItems, NucleusSmallSort>(keys, n, bits, sm.small);
    return keys;
  }
  if (n <= kNucleusTile) {
    SortTileInPlace<kNucleusItems, NucleusTileSort>(keys, n, bits, sm.sort);
    return keys;
  }
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

// grid (batch): row blockIdx.x's token. Greedy rows from the slices; sampled rows sort their
// candidates, find the kept set's end in run B, then the draw in A or B.
__global__ void __launch_bounds__(kThreads)
    NucleusSampleKernel(const __grid_constant__ NucleusParams p) {
  __shared__ union {
    NucleusSortSmem sort;
    SampleSmem walk;
  } sm;
  __shared__ int n_floor_shared;
  const int64_t b = blockIdx.x;
  if (!(p.rows[b].temperature > 0.f)) {  // greedy (NaN temperature too)
    const int id =
        GreedyFromSlices(p.slice_val + b * p.slices, p.slice_id + b * p.slices, p.slices);
    if (threadIdx.x == 0) p.out[b] = id;
    return;
  }
  const RowParams rp = p.rows[b];
  const NucleusPlan plan = p.plan[b];
  const int n = plan.n_a + plan.n_b;
  if (plan.max == -INFINITY || n == 0) {  // every logit -inf/NaN (n == 0: never, as planned)
    if (threadIdx.x == 0) p.out[b] = 0;
    return;
  }
  const uint64_t* sorted = SortCandidates(p.cand + b * p.vocab, p.alt + b * p.vocab, n, sm.sort);
  __syncthreads();
  const CandidateWeights wa{sorted, plan.max, rp.temperature, p.id_bits};
  const CandidateWeights wb{sorted + plan.n_a, plan.max, rp.temperature, p.id_bits};
  double kept_mass = plan.z;
  int64_t kept_b = plan.n_b;
  if (plan.cut) {
    const float floor = MinPFloor(rp.min_p);
    // Entries at or above the floor: a prefix (weights fall along the order), counted. Without
    // min_p every candidate (weight > 0) is.
    int64_t n_floor = plan.n_b;
    if (rp.min_p > 0.f) {
      int above = 0;
      for (int64_t i = threadIdx.x; i < plan.n_b; i += kThreads) above += wb(i) >= floor;
      above = BlockReduceI(sm.walk.reduce_i).Sum(above);
      if (threadIdx.x == 0) n_floor_shared = above;
      __syncthreads();
      n_floor = n_floor_shared;
    }
    kept_b = n_floor;
    if (rp.top_p < 1.f) {
      const double limit = static_cast<double>(rp.top_p) * plan.z;
      double unused;
      const int64_t j =
          FirstPrefix(wb, n_floor, limit - plan.base_b, /*strict=*/false, sm.walk, &unused);
      kept_b = min(j + 1, n_floor);
    }
    kept_mass = plan.base_b + BlockSumWeights(wb, kept_b, sm.walk);
  }
  const double target = static_cast<double>(UniformFromSeedDevice(rp.seed, rp.step)) * kept_mass;
  double unused;
  int64_t pick = -1;
  if (plan.n_a > 0) {
    const int64_t j =
        FirstPrefix(wa, plan.n_a, target - plan.base_a, /*strict=*/true, sm.walk, &unused);
    if (j < plan.n_a) pick = j;
  }
  if (pick < 0 && plan.cut && kept_b > 0) {
    const int64_t j =
        FirstPrefix(wb, kept_b, target - plan.base_b, /*strict=*/true, sm.walk, &unused);
    pick = plan.n_a + min(j, kept_b - 1);
  }
  if (pick < 0) pick = plan.n_a > 0 ? plan.n_a - 1 : 0;  // rounding past the end of A's mass
  if (threadIdx.x == 0) p.out[b] = CandidateId(sorted[pick], p.id_bits);
}

}  // namespace
}  // namespace corolla::cuda
