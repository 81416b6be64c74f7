// Sampling without ordering the vocabulary (top-p, min-p, the temperature alone, top-k). The
// full sort ordered all of every row to find two places in it: where top-p / min-p cut the kept
// set, and where the draw lands. Both are prefixes of the sampling order,
// and a histogram of the row's weights by x = (max - l) / T (a logit's distance below the max,
// in units of T; 128 bins a unit, the last bin takes every x >= 32) says which bins hold them:
//   NucleusHistKernel   each bin's mass and count, many CTAs a row;
//   NucleusPlanKernel   run B: the bins where the cut can fall (the mass reaching top_p x Z,
//                       the bin of the min-p floor; a neighbour too where a sum lies within
//                       1e-9 x Z of its limit); run A: the bins where the draw u x kept can
//                       fall, the kept mass lying between the mass before B and through it;
//   NucleusGatherKernel the entries of runs A and B (typically a few hundred a row);
//   NucleusSampleKernel one CTA a row sorts them (by logit descending, then id) and finds the
//                       cut in B from the mass before it, then the draw in A (or B): up to a
//                       tile in registers and binary searches of shared-memory sums
//                       (SampleTile), past it in global memory and block-scan walks
//                       (sampling_nucleus_pick.cuh).
// x is monotone in the logit (correctly rounded subtraction and division), so a bin is a
// contiguous piece of the sampling order and ties share one. A row that names a top_k K needs no
// masses: where K is at most its slices (DirectTopK; Qwen3's top_k 20 against 74), the K-th
// largest slice best bounds its K-th entry from below and the entries at or above the bound (~50)
// are gathered without a histogram; else the bins' counts give the bin where the count reaches K,
// and run B is the bins through it. Either way SampleTile sums the first K's weights itself. The
// tokens are those of the full sort; the sums differ in the last bits (the bins' masses through
// fixed point and atomics), as the known deviations in sampling.cu say. A row whose runs hold more
// than a tile (4096 entries: logits flat within ~1/64 of T: all equal, or a temperature far above
// the spread) sorts them with one CTA in global memory: slow, exact. A step of a few rows runs all
// of it, the argmax slices too, in one cooperative launch whose CTAs meet at counters
// (sampling_nucleus_fused.cuh). The candidates' keys and their sort are in sampling_candidates.cuh.
// Included by sampling.cu (which enqueues the kernels: SampleNucleusInto) and
// sampling_nucleus_pick.cuh.
#pragma once

#include <cub/cub.cuh>

#include "kernels/cuda/sampling_candidates.cuh"
#include "kernels/cuda/sampling_walk.cuh"

namespace corolla::cuda {
namespace {

constexpr int kNucleusBins = 4096;
constexpr float kNucleusBinsPerUnit = 128.f;
constexpr int kNucleusChunk = kThreads * kNucleusItems;  // entries a histogram / gather CTA

struct NucleusPlan {
  float max;              // the row's largest logit; -inf: nothing to sample (token 0)
  int cut;                // top-p or min-p cut the kept set inside run B
  int top_k;              // > 0: run B holds the row's first top_k entries (bins from 0; z unset)
  int direct;             // top-k without bins: run B is every entry >= at_least, n_b the cursor's
  float at_least;         // (DirectTopK)
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
  float* slice_val;   // ArgmaxSliceKernel's bests of every row [batch, slices] (the fused
  int32_t* slice_id;  // kernel's own: slices = chunks)
  int slices;
  double* bin_mass;   // [batch, kNucleusBins], zeroed
  int* bin_count;     // [batch, kNucleusBins], zeroed
  int* cursor;        // [batch], zeroed: entries gathered
  unsigned* sync;     // [batch, kNucleusSyncs], zeroed: the fused kernel's counters
                      // (sampling_nucleus_fused.cuh)
  NucleusPlan* plan;  // [batch]
  uint64_t* cand;     // [batch, vocab]: the runs' entries as CandidateKey
  uint64_t* alt;      // [batch, vocab]: the large sort's other buffer
  int id_bits;        // bits of the largest id
  int ranked_max;     // rows of at most this many candidates take SampleRanked (0: none)
  int32_t* out;
  uint64_t* timeline;  // the fused kernel's record (timeline.h) or null
};

struct MaxF {
  __device__ float operator()(float a, float b) const { return a > b ? a : b; }
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

// Whether sampled row rp's top_k entries are found without the bins: the K-th largest of the
// slices' bests (each a distinct entry) bounds the row's K-th entry from below, so the entries at
// or above it (of weight > 0) hold the first K (~50 a row for Qwen3's top_k 20 over 74 slices of
// random logits). PlanRow finds the bound, GatherChunk takes those entries, no histogram is made.
__device__ __forceinline__ bool DirectTopK(const NucleusParams& p, const RowParams& rp) {
  return rp.top_k > 0 && rp.top_k <= p.slices && p.slices <= kThreads;
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

// A histogram CTA's bins in 2^-51 fixed point, two 32-bit words a bin (native shared-memory
// atomics, the carry by hand): doubles took compare-and-swap loops, 11.7 us a batch-1 histogram
// against 7.9 (H200, ncu; batch 64 64.8 against 45.7). Each weight (<= 1) loses < 2^-51, so a
// row's sums stay within 152k x 2^-51 < 1e-10 of its mass Z of the exact ones, inside the plan's
// 1e-9 x Z margins; at most 4096 weights a CTA keep a bin's sum under 2^63.
struct HistSmem {
  unsigned fixed[2][kNucleusBins];    // low words, high words
  unsigned count2[kNucleusBins / 2];  // two 16-bit counts a word: <= 4096 entries a CTA
  typename BlockReduceD::TempStorage reduce_d;
  typename BlockReduceI::TempStorage reduce_i;
};

__device__ __forceinline__ void ZeroHist(HistSmem& sm) {
  for (int i = threadIdx.x; i < kNucleusBins; i += kThreads) sm.fixed[0][i] = sm.fixed[1][i] = 0;
  for (int i = threadIdx.x; i < kNucleusBins / 2; i += kThreads) sm.count2[i] = 0;
}

// A thread's entries' bins (NucleusEntry's; kNoBin for weight 0), two 16-bit halves a word: what
// HistChunk found, kept in the fused kernel's registers for its gather.
constexpr int kBinWords = kNucleusItems / 2;
constexpr unsigned kNoBin = 0xffffu;  // above every bin, so in no run

// Entry j's bin; called for j = 0, 1, .. in order (an even j starts its word).
__device__ __forceinline__ void SetBin(unsigned (&bins)[kBinWords], int j, unsigned bin) {
  bins[j / 2] = j % 2 == 0 ? bin : (bins[j / 2] & 0xffffu) | (bin << 16);
}

__device__ __forceinline__ int BinOf(const unsigned (&bins)[kBinWords], int j) {
  return static_cast<int>((bins[j / 2] >> (16 * (j % 2))) & 0xffffu);
}

// A chunk's entries v (LoadChunk) added to sampled row b's bins; sm zeroed (ZeroHist) with a CTA
// barrier since. The last bin (most of a peaked row's entries) sums in registers: no contention.
// A top-k row's plan reads counts only (PlanRow), so its masses are not summed. Each entry's bin
// goes to `bins`.
__device__ __forceinline__ void HistChunk(const NucleusParams& p, int64_t b,
                                          const float (&v)[kNucleusItems], float max, float t,
                                          HistSmem& sm, unsigned (&bins)[kBinWords]) {
  const bool masses = !(p.rows[b].top_k > 0);
  double tail = 0.0;
  int tail_n = 0;
#pragma unroll
  for (int j = 0; j < kNucleusItems; ++j) {
    float w;
    int bin;
    const bool entry = NucleusEntry(v[j], max, t, w, bin);
    SetBin(bins, j, entry ? bin : kNoBin);
    if (!entry) continue;
    if (bin == kNucleusBins - 1) {
      tail += w;
      ++tail_n;
    } else {
      if (masses) {
        const unsigned long long q =
            static_cast<unsigned long long>(static_cast<double>(w) * 0x1p51);
        const unsigned lo = static_cast<unsigned>(q);
        const unsigned old = atomicAdd(&sm.fixed[0][bin], lo);
        atomicAdd(&sm.fixed[1][bin], static_cast<unsigned>(q >> 32) + (old + lo < old ? 1u : 0u));
      }
      atomicAdd(&sm.count2[bin / 2], 1u << (16 * (bin % 2)));
    }
  }
  tail = BlockReduceD(sm.reduce_d).Sum(tail);
  tail_n = BlockReduceI(sm.reduce_i).Sum(tail_n);
  __syncthreads();
  double* row_mass = p.bin_mass + b * kNucleusBins;
  int* row_count = p.bin_count + b * kNucleusBins;
  for (int i = threadIdx.x; i < kNucleusBins - 1; i += kThreads) {
    const int c = static_cast<int>((sm.count2[i / 2] >> (16 * (i % 2))) & 0xffffu);
    if (c == 0) continue;
    const unsigned long long q =
        (static_cast<unsigned long long>(sm.fixed[1][i]) << 32) | sm.fixed[0][i];
    if (masses) atomicAdd(&row_mass[i], static_cast<double>(q) * 0x1p-51);
    atomicAdd(&row_count[i], c);
  }
  if (threadIdx.x == 0 && tail_n > 0) {
    atomicAdd(&row_mass[kNucleusBins - 1], tail);
    atomicAdd(&row_count[kNucleusBins - 1], tail_n);
  }
}

// grid (chunks, batch): the bins of chunk blockIdx.x of sampled row blockIdx.y, added to the
// row's.
__global__ void __launch_bounds__(kThreads)
    NucleusHistKernel(const __grid_constant__ NucleusParams p) {
  const int64_t b = blockIdx.y;
  if (!(p.rows[b].temperature > 0.f) || DirectTopK(p, p.rows[b])) return;
  __shared__ HistSmem sm;
  float v[kNucleusItems];
  LoadChunk(p, b, static_cast<int64_t>(blockIdx.x) * kNucleusChunk, v);  // before the max's loads
  ZeroHist(sm);
  const float max = BlockRowMax(p.slice_val + b * p.slices, p.slices);  // synchronises
  if (max == -INFINITY) return;
  unsigned bins[kBinWords];  // unused: the gather is a kernel of its own
  HistChunk(p, b, v, max, p.rows[b].temperature, sm, bins);
}

// Bins a plan round picks: the last bin holding an entry (max), the first passing two sums (min).
struct PlanPick {
  int last, lo, hi;
};
struct PlanPickOp {
  __device__ PlanPick operator()(const PlanPick& a, const PlanPick& b) const {
    return {max(a.last, b.last), min(a.lo, b.lo), min(a.hi, b.hi)};
  }
};

struct PlanSmem {
  double cum[PaddedSize(kNucleusBins)];  // the bins' masses, then their inclusive sums
  typename BlockScan::TempStorage scan_d;
  typename cub::BlockReduce<PlanPick, kThreads>::TempStorage reduce_pick;
  typename cub::BlockReduce<long long, kThreads>::TempStorage reduce_ll;
  PlanPick picked;
  long long counts;
  float slice_best[kThreads];  // DirectTopK's slices, then the K-th largest
  float kth;
};

// Sampled row b's runs (NucleusPlan) from its bins, in every thread. The bins come in striped
// (coalesced; 3.5 us blocked, H200 session 35) and the masses turn blocked through shared memory
// for the scan; each thread then tests the inclusive sums it holds against the limits and block
// reductions pick the first bins that pass (thread 0's binary searches took 2.6 us), in two
// rounds: the cut's bins (top-p's sum, min-p's floor), then the draw's (u x the kept mass, which
// the cut's bins bound). The counts of the runs' entries come from the striped counts. A top-k
// row sums counts instead of masses (run B through the bin where they reach K); a DirectTopK
// row's plan is only its bound, read from the slices (no bins).
__device__ NucleusPlan PlanRow(const NucleusParams& p, int64_t b, float row_max, PlanSmem& sm) {
  NucleusPlan plan{};
  plan.max = row_max;
  plan.a_lo = plan.b_lo = 1;
  if (row_max == -INFINITY) return plan;
  const RowParams rp = p.rows[b];
  if (DirectTopK(p, rp)) {
    // The K-th largest of the slices' bests (ties counted): each thread one slice, ranked against
    // the others.
    const float v = threadIdx.x < p.slices ? p.slice_val[b * p.slices + threadIdx.x] : -INFINITY;
    sm.slice_best[threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x < p.slices) {
      int rank = 0;
      for (int j = 0; j < p.slices; ++j) {
        const float u = sm.slice_best[j];
        rank += u > v || (u == v && j < static_cast<int>(threadIdx.x));
      }
      if (rank == rp.top_k - 1) sm.kth = v;
    }
    __syncthreads();
    plan.direct = 1;
    plan.at_least = sm.kth;
    plan.top_k = rp.top_k;
    plan.cut = 1;
    plan.b_lo = 0;
    __syncthreads();  // sm is free again
    return plan;
  }
  const bool top_k = rp.top_k > 0;  // the bins' counts are summed, not their masses
  constexpr int kPer = kNucleusBins / kThreads;
  constexpr int kNone = 0x7fffffff;
  const double* row_mass = p.bin_mass + b * kNucleusBins;
  const int* row_count = p.bin_count + b * kNucleusBins;
  int c[kPer];  // striped: bin threadIdx.x + j x kThreads
  int last = -1;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int bin = threadIdx.x + j * kThreads;
    c[j] = row_count[bin];
    StorePadded(sm.cum, bin, top_k ? static_cast<double>(c[j]) : row_mass[bin]);
    if (c[j] > 0) last = bin;
  }
  __syncthreads();
  double cum[kPer];  // blocked: bin threadIdx.x x kPer + j
  double local = 0.0;
  const PaddedSums sums{sm.cum, 0};
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    cum[j] = sums[threadIdx.x * kPer + j];
    local += cum[j];
  }
  double before;
  BlockScan(sm.scan_d).ExclusiveSum(local, before);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    before += cum[j];
    cum[j] = before;
  }
  __syncthreads();  // every mass read
#pragma unroll
  for (int j = 0; j < kPer; ++j) StorePadded(sm.cum, threadIdx.x * kPer + j, cum[j]);
  __syncthreads();
  const double z = sums[kNucleusBins - 1];
  const double delta = 1e-9 * z;
  // This thread's first bin whose inclusive sum passes x (>= x, or > x when strict).
  auto first_here = [&](double x, bool strict) {
    int f = kNone;
#pragma unroll
    for (int j = kPer - 1; j >= 0; --j)
      if (strict ? cum[j] > x : cum[j] >= x) f = threadIdx.x * kPer + j;
    return f;
  };
  auto pick = [&](const PlanPick& mine) {
    const PlanPick r =
        cub::BlockReduce<PlanPick, kThreads>(sm.reduce_pick).Reduce(mine, PlanPickOp());
    if (threadIdx.x == 0) sm.picked = r;
    __syncthreads();
    const PlanPick all = sm.picked;
    __syncthreads();
    return all;
  };
  auto mass_before = [&](int bin) { return bin > 0 ? sums[bin - 1] : 0.0; };
  if (top_k) {  // K past the slices (DirectTopK is false)
    // Run B is the bins through the first whose inclusive count reaches top_k (all of them when
    // fewer entries have weight > 0): they hold the row's first top_k entries, top-p and min-p
    // cut inside them and SampleTile sums their weights. The last bin (x >= 32: each weight
    // under e^-32 of the top's) stays out: top_k such weights are under 2^-24 of the kept mass
    // for any vocabulary, so the draw (u <= 1 - 2^-24) never lands there; leaving their mass out
    // of z and the kept mass moves the limits by that little (the sums' known deviation).
    const PlanPick reach = pick({last, first_here(static_cast<double>(rp.top_k), false), kNone});
    plan.top_k = rp.top_k;
    plan.cut = 1;
    plan.b_lo = 0;
    plan.b_hi = min(min(reach.lo, max(reach.last, 0)), kNucleusBins - 2);
    plan.n_b = static_cast<int>(sums[plan.b_hi]);
    __syncthreads();  // sm is free again
    return plan;
  }
  const bool top_p = rp.top_p < 1.f;
  const bool min_p = rp.min_p > 0.f;
  const double limit = static_cast<double>(rp.top_p) * z;
  const PlanPick cut = pick({last, top_p ? first_here(limit - delta, false) : kNone,
                             top_p ? first_here(limit + delta, false) : kNone});
  last = max(cut.last, 0);
  // The first bin in [0, last] whose sum passes (the sums stay flat past last), or last.
  auto cap = [&](int bin) { return min(bin, last); };
  plan.cut = top_p || min_p;
  plan.z = z;
  plan.b_lo = 1;
  plan.b_hi = 0;
  if (plan.cut) {
    int c_lo = cap(cut.lo), c_hi = cap(cut.hi), f_lo = last, f_hi = last;
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
  const double k_hi = plan.cut ? sums[plan.b_hi] : z;
  const double u = static_cast<double>(UniformFromSeedDevice(rp.seed, rp.step));
  const PlanPick draw =
      pick({-1, first_here(u * k_lo - delta, true), first_here(u * k_hi + delta, true)});
  plan.a_lo = cap(draw.lo);
  plan.a_hi = cap(draw.hi);
  if (plan.cut) {
    plan.a_hi = min(plan.a_hi, plan.b_hi);
    if (plan.a_hi + 1 >= plan.b_lo) {  // touching: one run, B, holds both
      plan.b_lo = min(plan.b_lo, plan.a_lo);
      plan.a_lo = 1;
      plan.a_hi = 0;
    }
  }
  plan.base_a = plan.a_lo <= plan.a_hi ? mass_before(plan.a_lo) : 0.0;
  plan.base_b = plan.b_lo <= plan.b_hi ? mass_before(plan.b_lo) : 0.0;
  // The runs' entries: run A's in the low word, B's in the high (each <= the vocabulary).
  long long n = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int bin = threadIdx.x + j * kThreads;
    if (bin >= plan.a_lo && bin <= plan.a_hi) n += c[j];
    if (bin >= plan.b_lo && bin <= plan.b_hi) n += static_cast<long long>(c[j]) << 32;
  }
  n = cub::BlockReduce<long long, kThreads>(sm.reduce_ll).Sum(n);
  if (threadIdx.x == 0) sm.counts = n;
  __syncthreads();
  plan.n_a = static_cast<int>(sm.counts & 0xffffffffll);
  plan.n_b = static_cast<int>(sm.counts >> 32);
  __syncthreads();  // sm is free again
  return plan;
}

// grid (batch): sampled row blockIdx.x's runs.
__global__ void __launch_bounds__(kThreads)
    NucleusPlanKernel(const __grid_constant__ NucleusParams p) {
  const int64_t b = blockIdx.x;
  if (!(p.rows[b].temperature > 0.f)) return;
  __shared__ PlanSmem sm;
  const NucleusPlan plan = PlanRow(p, b, BlockRowMax(p.slice_val + b * p.slices, p.slices), sm);
  if (threadIdx.x == 0) p.plan[b] = plan;
}

struct GatherSmem {
  typename cub::BlockScan<int, kThreads>::TempStorage scan;
  int base;
};

// The entries v (LoadChunk) of the chunk at `begin` of sampled row b that lie in its runs (their
// bins HistChunk's; a direct top-k row has none), appended to the row's candidates in any order
// (the sort key holds the id): one atomic a CTA reserves the places, a block scan shares them out.
// (One a warp and entry index, whose returned values the warp waited for in turn, cost L2 round
// trips one after another.) The tests are integer or float compares, not each entry's weight
// again: a fraction of the code, which the engine's step fetches cold after the decode graph's
// kernels (session 37).
__device__ __forceinline__ void GatherChunk(const NucleusParams& p, int64_t b, int64_t begin,
                                            const float (&v)[kNucleusItems],
                                            const unsigned (&bins)[kBinWords],
                                            const NucleusPlan& plan, float t, GatherSmem& sm) {
  unsigned take = 0;
  int mine = 0;
  float w;
  int bin;
  if (!plan.direct) {
#pragma unroll
    for (int j = 0; j < kNucleusItems; ++j) {
      const int bj = BinOf(bins, j);
      if ((bj >= plan.a_lo && bj <= plan.a_hi) || (bj >= plan.b_lo && bj <= plan.b_hi)) {
        take |= 1u << j;
        ++mine;
      }
    }
  } else if (plan.max != INFINITY && NucleusEntry(plan.at_least, plan.max, t, w, bin)) {
    // The bound's weight is > 0, so every entry at or above it has one (the weight grows with the
    // logit): the bound alone decides.
#pragma unroll
    for (int j = 0; j < kNucleusItems; ++j)
      if (v[j] >= plan.at_least) {
        take |= 1u << j;
        ++mine;
      }
  } else {
#pragma unroll
    for (int j = 0; j < kNucleusItems; ++j)
      if (NucleusEntry(v[j], plan.max, t, w, bin) && v[j] >= plan.at_least) {
        take |= 1u << j;
        ++mine;
      }
  }
  int offset, total;
  cub::BlockScan<int, kThreads>(sm.scan).ExclusiveSum(mine, offset, total);
  if (threadIdx.x == 0 && total > 0) sm.base = atomicAdd(&p.cursor[b], total);
  __syncthreads();
  if (total == 0) return;
  uint64_t* out = p.cand + b * p.vocab + sm.base + offset;
#pragma unroll
  for (int j = 0; j < kNucleusItems; ++j)
    if (take & (1u << j)) {
      const int id = static_cast<int>(begin + j * kThreads + threadIdx.x);
      *out++ = CandidateKey(v[j], id, p.id_bits);
    }
}

// grid (chunks, batch): the candidates of chunk blockIdx.x of row blockIdx.y.
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
  unsigned bins[kBinWords];
  if (!plan.direct) {
#pragma unroll
    for (int j = 0; j < kNucleusItems; ++j) {
      float w;
      int bin;
      SetBin(bins, j, NucleusEntry(v[j], plan.max, t, w, bin) ? bin : kNoBin);
    }
  }
  __shared__ GatherSmem sm;
  GatherChunk(p, b, begin, v, bins, plan, t, sm);
}

}  // namespace
}  // namespace corolla::cuda
