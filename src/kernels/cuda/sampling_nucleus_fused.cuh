// The nucleus path (sampling_nucleus.cuh) of a step of a few rows in one cooperative launch: the
// CTAs of a row meet at counters in global memory where the separate launches had kernel
// boundaries, and each keeps its chunk of logits in registers throughout. Included by sampling.cu
// only (after sampling_nucleus.cuh), which launches it when every CTA of the step fits on the
// device at once (SampleNucleusInto).
#pragma once

#include "kernels/cuda/sampling_nucleus.cuh"
#include "kernels/cuda/sampling_nucleus_pick.cuh"
#include "kernels/cuda/timeline.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

// The counters of a row's CTAs in NucleusFusedKernel: [batch, kNucleusSyncs], zeroed.
constexpr int kNucleusSyncs = 3;

// Adds this CTA to *counter once its writes are visible to the device; with wait, then waits
// for all `ctas` of the row (and sees their writes).
__device__ __forceinline__ void RowSync(unsigned* counter, unsigned ctas, bool wait) {
  __syncthreads();
  if (threadIdx.x == 0) {
    wgmma::ArriveRelease(counter);
    if (wait) wgmma::SpinUntil(counter, ctas);
  }
  __syncthreads();
}

union NucleusFusedSmem {
  HistSmem hist;
  PlanSmem plan;
  GatherSmem gather;
  NucleusSampleSmem sample;
};

// grid (chunks, batch), every CTA resident at once (a cooperative launch): a step of a few rows
// in one launch, the chunk's logits kept in registers throughout. Each CTA writes the best
// (value, id) of its chunk's two halves as ArgmaxSliceKernel writes a slice's (slices = 2 x
// chunks here); the row's CTAs meet; greedy rows then take their token in CTA 0, sampled rows
// histogram their chunks (not a DirectTopK row), meet, plan (every CTA its own copy of the same
// plan) and gather, meet once more, and CTA 0 sorts and walks (SampleRow). Timeline marks
// (COROLLA_TIMELINE): 0 the slices in, 5 the chunk's bins added, 1 the row's bins in, 2 the plan,
// 3 the candidates in (CTA 0), 4 sorted.
__global__ void __launch_bounds__(kThreads)
    NucleusFusedKernel(const __grid_constant__ NucleusParams p) {
  __shared__ NucleusFusedSmem sm;
  const TimelineScope scope(p.timeline);
  scope.Waited();  // no dependency wait: the marks count from the entry
  const int64_t b = blockIdx.y;
  const float t = p.rows[b].temperature;
  const bool sampled = t > 0.f;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kNucleusChunk;
  float v[kNucleusItems];
  LoadChunk(p, b, begin, v);
  {  // the bests of the chunk's two halves: slices of ArgmaxSliceKernel's size (2048)
    constexpr int kHalf = kNucleusItems / 2;
    float lo[kHalf], hi[kHalf];
#pragma unroll
    for (int j = 0; j < kHalf; ++j) {
      lo[j] = v[j];
      hi[j] = v[kHalf + j];
    }
    const int64_t slice = b * p.slices + 2 * blockIdx.x;
    ChunkBest(lo, begin, p.slice_val + slice, p.slice_id + slice);
    __syncthreads();  // BlockBest's shared memory again
    ChunkBest(hi, begin + kHalf * kThreads, p.slice_val + slice + 1, p.slice_id + slice + 1);
  }
  unsigned* sync = p.sync + b * kNucleusSyncs;
  RowSync(sync, gridDim.x, sampled || blockIdx.x == 0);
  scope.Mark(0);
  if (!sampled) {
    if (blockIdx.x == 0) {
      const int id =
          GreedyFromSlices(p.slice_val + b * p.slices, p.slice_id + b * p.slices, p.slices);
      if (threadIdx.x == 0) p.out[b] = id;
    }
    return;
  }
  const float row_max = BlockRowMax(p.slice_val + b * p.slices, p.slices);
  if (row_max == -INFINITY) {  // every CTA of the row sees it: none waits below
    if (blockIdx.x == 0 && threadIdx.x == 0) p.out[b] = 0;
    return;
  }
  unsigned bins[kBinWords];  // the histogram's, for the gather (none for a DirectTopK row)
  if (!DirectTopK(p, p.rows[b])) {
    ZeroHist(sm.hist);
    __syncthreads();
    HistChunk(p, b, v, row_max, t, sm.hist, bins);
    scope.Mark(5);
    RowSync(sync + 1, gridDim.x, true);
    scope.Mark(1);
  }
  const NucleusPlan plan = PlanRow(p, b, row_max, sm.plan);
  scope.Mark(2);
  GatherChunk(p, b, begin, v, bins, plan, t, sm.gather);
  RowSync(sync + 2, gridDim.x, blockIdx.x == 0);
  if (blockIdx.x != 0) return;
  scope.Mark(3);
  SampleRow(p, b, plan, sm.sample, &scope);
}

}  // namespace
}  // namespace corolla::cuda
