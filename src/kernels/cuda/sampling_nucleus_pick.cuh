// A nucleus row's token from its candidates (the entries of runs A and B that
// sampling_nucleus.cuh's gather wrote): sorted, the kept set's end found in run B, the draw in A
// or B. SampleRow serves NucleusSampleKernel here and the fused kernel
// (sampling_nucleus_fused.cuh). Included by sampling.cu and sampling_nucleus_fused.cuh.
#pragma once

#include "kernels/cuda/sampling_candidates.cuh"
#include "kernels/cuda/sampling_nucleus.cuh"
#include "kernels/cuda/timeline.cuh"

namespace corolla::cuda {
namespace {

union NucleusSampleSmem {
  NucleusSortSmem sort;
  SampleSmem walk;
};

// The id at position `pick` of n keys sorted on their logits' bits only (blocked over the block,
// kItemsT a thread; ties in any order): the position's tie group (the keys whose logit bits equal
// the pick's) starts after every key of a larger logit, and the sampling order puts its members in
// id order, so the id is the group's (pick - start)-th smallest. In every thread.
template <int kItemsT>
__device__ int TieGroupId(const uint64_t (&k)[kItemsT], int n, int pick, int id_bits,
                          NucleusSortSmem& sm) {
#pragma unroll
  for (int j = 0; j < kItemsT; ++j)
    if (threadIdx.x * kItemsT + j == pick) {
      sm.pick_logit = k[j] >> id_bits;
      sm.pick_id = CandidateId(k[j], id_bits);
    }
  __syncthreads();
  const uint64_t logit = sm.pick_logit;
  long long counts = 0;  // before the group (low word), in it (high word)
#pragma unroll
  for (int j = 0; j < kItemsT; ++j) {
    if (threadIdx.x * kItemsT + j >= n) continue;
    const uint64_t l = k[j] >> id_bits;
    counts += l < logit ? 1ll : l == logit ? (1ll << 32) : 0ll;
  }
  counts = cub::BlockReduce<long long, kThreads>(sm.reduce_ll).Sum(counts);
  if (threadIdx.x == 0) {
    sm.before_group = counts;
    sm.n_listed = 0;
  }
  __syncthreads();
  const int rank = pick - static_cast<int>(sm.before_group & 0xffffffffll);
  const int members = static_cast<int>(sm.before_group >> 32);
  // No tie: the key's own id. Else the members' ids are listed (the sums are no longer needed)
  // and each member finds its rank among them.
  if (members == 1) return sm.pick_id;
#pragma unroll
  for (int j = 0; j < kItemsT; ++j)
    if (threadIdx.x * kItemsT + j < n && k[j] >> id_bits == logit)
      sm.tie_ids[atomicAdd(&sm.n_listed, 1)] = CandidateId(k[j], id_bits);
  __syncthreads();
  for (int i = threadIdx.x; i < members; i += kThreads) {
    const int32_t id = sm.tie_ids[i];
    int smaller = 0;
    for (int m = 0; m < members; ++m) smaller += sm.tie_ids[m] < id;
    if (smaller == rank) sm.pick = id;  // one member: the ids differ
  }
  __syncthreads();
  return sm.pick;
}

// The place of row b's draw among its n sorted candidates, from their weights' inclusive sums
// (`prefix`, StorePadded's layout) and `above`, run B's entries at or above the min-p floor
// (read only for a min-p row): the kept set's end in run B, then the draw in A or B, by binary
// searches of the sums. One thread's.
__device__ int PickFromSums(const RowParams& rp, const NucleusPlan& plan, const double* prefix,
                            int above) {
  const PaddedSums sums{prefix, 0};
  const PaddedSums sums_b{prefix, plan.n_a};
  const double mass_a = plan.n_a > 0 ? sums[plan.n_a - 1] : 0.0;  // B's sums are past it
  // A top-k row keeps B's first top_k entries (n_a = 0, base_b = 0), whose mass is its z.
  const int n_b = plan.top_k > 0 ? min(plan.n_b, plan.top_k) : plan.n_b;
  const double z = plan.top_k > 0 ? sums_b[n_b - 1] : plan.z;
  double kept_mass = z;
  int kept_b = n_b;
  if (plan.cut) {
    const int n_floor = rp.min_p > 0.f ? min(above, n_b) : n_b;
    kept_b = n_floor;
    if (rp.top_p < 1.f) {
      const double limit = static_cast<double>(rp.top_p) * z;
      const int j = static_cast<int>(
          FirstSumPast(sums_b, n_floor, limit - plan.base_b + mass_a, /*strict=*/false));
      kept_b = min(j + 1, n_floor);
    }
    kept_mass = plan.base_b + (kept_b > 0 ? sums_b[kept_b - 1] - mass_a : 0.0);
  }
  const double target = static_cast<double>(UniformFromSeedDevice(rp.seed, rp.step)) * kept_mass;
  int pick = -1;
  if (plan.n_a > 0) {
    const int j =
        static_cast<int>(FirstSumPast(sums, plan.n_a, target - plan.base_a, /*strict=*/true));
    if (j < plan.n_a) pick = j;
  }
  if (pick < 0 && plan.cut && kept_b > 0) {
    const int j = static_cast<int>(
        FirstSumPast(sums_b, kept_b, target - plan.base_b + mass_a, /*strict=*/true));
    pick = plan.n_a + min(j, kept_b - 1);
  }
  if (pick < 0) pick = plan.n_a > 0 ? plan.n_a - 1 : 0;  // rounding past the end of A's mass
  return pick;
}

// Sampled row b's token when its n candidates fit kItemsT a thread: they are sorted in
// registers (blocked: thread t holds entries t x kItemsT ..) on their logits' bits alone, their
// weights' inclusive sums go to shared memory in one block scan, thread 0 finds the kept set's end
// in run B and then the draw in A or B by binary searches of those sums, and the pick's id comes
// from its tie group (TieGroupId). The sums of run B are those of the whole tile less A's
// (rounding in the last bits, as the walks'). Sorting without the 18 or so id bits takes 3-4
// radix passes where the whole key took 7; ties keep the gather's order, which only the id at the
// pick needs, as equal logits have equal weights.
template <int kItemsT, typename Sort>
__device__ void SampleTile(const NucleusParams& p, int64_t b, const NucleusPlan& plan,
                           typename Sort::TempStorage& temp, NucleusSortSmem& sm,
                           const TimelineScope* scope) {
  const RowParams rp = p.rows[b];
  const uint64_t* cand = p.cand + b * p.vocab;
  const int n = plan.n_a + plan.n_b;
  uint64_t k[kItemsT];
#pragma unroll
  for (int j = 0; j < kItemsT; ++j) {
    const int i = threadIdx.x * kItemsT + j;
    k[j] = i < n ? cand[i] : ~uint64_t{0};  // padding sorts last (a stable sort on the low bits)
  }
  const int bits = VaryingBits(k, n, cand[0], sm);
  if (bits > p.id_bits) Sort(temp).Sort(k, p.id_bits, bits);  // else every logit is equal
  __syncthreads();  // the sort's storage takes the sums
  if (scope != nullptr) scope->Mark(4);
  const float floor = MinPFloor(rp.min_p);
  double w[kItemsT];
  double local = 0.0;
  int above = 0;  // run B's entries at or above the floor: a prefix of B (weights fall along it)
#pragma unroll
  for (int j = 0; j < kItemsT; ++j) {
    const int i = threadIdx.x * kItemsT + j;
    const float wf =
        i < n ? WeightOf(CandidateLogit(k[j], p.id_bits), plan.max, rp.temperature) : 0.f;
    w[j] = wf;
    local += w[j];
    above += i >= plan.n_a && i < n && wf >= floor;
  }
  double sum;
  BlockScan(sm.scan_d).ExclusiveSum(local, sum);
#pragma unroll
  for (int j = 0; j < kItemsT; ++j) {
    sum += w[j];
    StorePadded(sm.prefix, threadIdx.x * kItemsT + j, sum);
  }
  if (rp.min_p > 0.f) above = BlockReduceI(sm.reduce_i).Sum(above);  // the row's: uniform
  __syncthreads();
  if (threadIdx.x == 0) sm.pick = PickFromSums(rp, plan, sm.prefix, above);
  __syncthreads();
  const int pick = sm.pick;
  const int id = TieGroupId(k, n, pick, p.id_bits, sm);
  if (threadIdx.x == 0) p.out[b] = id;
}

// Sampled row b's token when its n candidates are at most one a thread (a top-k row's ~50
// entries at or above its bound, a peaked row's runs): each thread counts the candidates below its
// own in shared memory and stores it at that place. The keys are distinct (the id is in their low
// bits), so the places are the sampling order with ties in id order: no radix passes, no tie
// search, and a fraction of SampleTile's code, which the engine's step runs cold after the decode
// graph's kernels (session 37).
__device__ void SampleRanked(const NucleusParams& p, int64_t b, const NucleusPlan& plan,
                             NucleusSortSmem& sm, const TimelineScope* scope) {
  const RowParams rp = p.rows[b];
  const int n = plan.n_a + plan.n_b;
  const int i = threadIdx.x;
  const uint64_t key = i < n ? p.cand[b * p.vocab + i] : 0;
  sm.ranked.keys[i] = key;
  __syncthreads();
  if (i < n) {
    int below = 0;
#pragma unroll 8
    for (int j = 0; j < n; ++j) below += sm.ranked.keys[j] < key;
    sm.ranked.sorted[below] = key;
  }
  __syncthreads();
  if (scope != nullptr) scope->Mark(4);
  const float w =
      i < n ? WeightOf(CandidateLogit(sm.ranked.sorted[i], p.id_bits), plan.max, rp.temperature)
            : 0.f;
  int above = i >= plan.n_a && i < n && w >= MinPFloor(rp.min_p);
  double sum;
  BlockScan(sm.scan_d).InclusiveSum(static_cast<double>(w), sum);
  StorePadded(sm.ranked.prefix, i, sum);
  if (rp.min_p > 0.f) above = BlockReduceI(sm.reduce_i).Sum(above);  // the row's: uniform
  __syncthreads();
  if (threadIdx.x == 0) {
    const int pick = PickFromSums(rp, plan, sm.ranked.prefix, above);
    p.out[b] = CandidateId(sm.ranked.sorted[pick], p.id_bits);
  }
}

// Sampled row b's token past a tile: its candidates sorted in global memory
// (SortLargeCandidates), the kept set's end found in run B, then the draw in A or B, by walks of
// block scans over the sorted keys.
__device__ void SampleLarge(const NucleusParams& p, int64_t b, const NucleusPlan& plan,
                            NucleusSampleSmem& sm, const TimelineScope* scope) {
  const RowParams rp = p.rows[b];
  const int n = plan.n_a + plan.n_b;
  const uint64_t* sorted =
      SortLargeCandidates(p.cand + b * p.vocab, p.alt + b * p.vocab, n, sm.sort);
  __syncthreads();
  if (scope != nullptr) scope->Mark(4);
  const CandidateWeights wa{sorted, plan.max, rp.temperature, p.id_bits};
  const CandidateWeights wb{sorted + plan.n_a, plan.max, rp.temperature, p.id_bits};
  // A top-k row keeps B's first top_k entries (n_a = 0, base_b = 0), whose mass is its z.
  const int64_t n_b = plan.top_k > 0 ? min(plan.n_b, plan.top_k) : plan.n_b;
  const double z = plan.top_k > 0 ? BlockSumWeights(wb, n_b, sm.walk) : plan.z;
  double kept_mass = z;
  int64_t kept_b = n_b;
  if (plan.cut) {
    const float floor = MinPFloor(rp.min_p);
    // Entries at or above the floor: a prefix (weights fall along the order), counted. Without
    // min_p every candidate (weight > 0) is.
    int64_t n_floor = n_b;
    if (rp.min_p > 0.f) {
      int above = 0;
      for (int64_t i = threadIdx.x; i < n_b; i += kThreads) above += wb(i) >= floor;
      above = BlockReduceI(sm.walk.reduce_i).Sum(above);
      if (threadIdx.x == 0) sm.walk.n_floor = above;
      __syncthreads();
      n_floor = sm.walk.n_floor;
    }
    kept_b = n_floor;
    if (rp.top_p < 1.f) {
      // The kept set's mass from the same walk: the mass before the cut's entry and its weight.
      const double limit = static_cast<double>(rp.top_p) * z;
      double before;
      const int64_t j =
          FirstPrefix(wb, n_floor, limit - plan.base_b, /*strict=*/false, sm.walk, &before);
      kept_b = min(j + 1, n_floor);
      kept_mass = plan.base_b + (j < n_floor ? before + wb(j) : before);
    } else {
      kept_mass = plan.base_b + BlockSumWeights(wb, kept_b, sm.walk);
    }
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

// Sampled row b's token (in thread 0 or the thread holding it). `scope` (or null) marks the
// sort's end (mark 4).
__device__ void SampleRow(const NucleusParams& p, int64_t b, NucleusPlan plan,
                          NucleusSampleSmem& sm, const TimelineScope* scope = nullptr) {
  if (plan.direct) plan.n_b = __ldcg(&p.cursor[b]);  // every entry gathered is in run B
  const int n = plan.n_a + plan.n_b;
  if (plan.max == -INFINITY || n == 0) {  // every logit -inf/NaN (n == 0: never, as planned)
    if (threadIdx.x == 0) p.out[b] = 0;
    return;
  }
  if (n <= p.ranked_max)
    SampleRanked(p, b, plan, sm.sort, scope);
  else if (n <= kThreads * kNucleusSmallItems)
    SampleTile<kNucleusSmallItems, NucleusSmallSort>(p, b, plan, sm.sort.small, sm.sort, scope);
  else if (n <= kNucleusTile)
    SampleTile<kNucleusItems, NucleusTileSort>(p, b, plan, sm.sort.sort, sm.sort, scope);
  else
    SampleLarge(p, b, plan, sm, scope);
}

// grid (batch): row blockIdx.x's token; greedy rows from the slices.
__global__ void __launch_bounds__(kThreads)
    NucleusSampleKernel(const __grid_constant__ NucleusParams p) {
  __shared__ NucleusSampleSmem sm;
  const int64_t b = blockIdx.x;
  if (!(p.rows[b].temperature > 0.f)) {  // greedy (NaN temperature too)
    const int id =
        GreedyFromSlices(p.slice_val + b * p.slices, p.slice_id + b * p.slices, p.slices);
    if (threadIdx.x == 0) p.out[b] = id;
    return;
  }
  SampleRow(p, b, p.plan[b], sm);
}

}  // namespace
}  // namespace corolla::cuda
