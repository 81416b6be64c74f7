// Backend::NormLinearAhead / LinearAhead / AwaitAhead: a batch-1 decode step's next qkv
// projection (the next layer's input norm folded in) issued right after the attention block, so
// that its weights stream into shared memory while the router and the MoE run, and o_proj issued
// before the attention, its weights staged beside it (Tuning().norm_linear_ahead, linear_ahead).
//
// The issue launches GemvAheadKernel on a side stream forked from the main one: one 4- or 8-warp
// CTA an SM bulk-copies its slice of W (the staged GEMV's slice and split, so the same bits; the
// split's last Tuning().ahead_global_warps warps' rows are only prefetched into L2 and read from
// global memory, so that the CTA leaves room on its SM for the CTAs beside it) at once, or once
// the await enters (Tuning().ahead_copy_at_await), then waits for `go`. The await is one CTA on
// the main stream (programmatic dependent launch): once the kernels before it have completed
// (the MoE has added its output into the sum; the attention has written x) it raises `go`, waits
// for `done` (the op's last CTA raises it once every output is stored), re-arms the flags and
// exits, so that the kernels after it read the output through the main stream's order. Both run
// inside the decode graphs only (ops.h says why). The side chain is joined into the main stream
// at the capture's end (CudaBackend::EndCapture): a join right after an op would put the op in
// front of its own await as a full dependency.
//
// Liveness: nothing the main stream runs before an await waits for the ahead CTAs, so those
// kernels complete and leave the SMs to the ahead CTAs that did not fit beside them, provided
// they can be placed beside the ahead CTAs at all (o_proj's carveout, LaunchAhead); by default
// the await does not release the kernel after it early (that kernel's CTAs, waiting on the
// await, could take room the last ahead CTAs need; opt-in COROLLA_AHEAD_AWAIT_EARLY_TRIGGER=1
// releases it once go is raised). A lost flag traps after 10 s (SpinUntil).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_staged.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/timeline.cuh"
#include "kernels/cuda/timeline.h"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {

// In global memory, zero between steps: `go` is raised (1) by the await kernel once the kernels
// before it have completed; each CTA of the op adds itself to `count` once its outputs are
// stored, and the last one re-arms `count` and raises `done`, which the await kernel waits for
// before it re-arms `go` and `done` and exits.
// `moe_arrivals` counts the CTAs of the MoE's down kernel where that raises go instead
// (Tuning().ahead_go_from_moe). `copy` (Tuning().ahead_copy_at_await): raised by the await kernel
// as it enters, which the op's CTAs wait for before they issue their copies.
struct AheadSignals {
  unsigned go, count, done, moe_arrivals, copy;
};

namespace {

// A CTA of kWarps (4 or 8: Tuning().ahead_warps) warps at <= 64 registers: 4 hold 8K of an SM's
// 64K registers while they wait (the staged kernel's 16 would hold half of them, room for two of
// the MoE's gate/up CTAs instead of four), 8 hold 16K and multiply faster once released.
template <int kWarps>
constexpr int kVirtualPerWarp = kStagedWarps / kWarps;

struct AheadParams {
  StagedGemvParams g;  // the staged NormLinear's (norm.y null: sum as it is; CTA 0 writes x)
  AheadSignals* signals;
  int global_warps;  // the split's last warps whose rows are read from global memory
  bool copy_at_await;  // the copies wait for signals->copy
};

// StageNormedX<true> with kWarps * 32 threads: chunk c of x by thread c % (kWarps * 32), the
// warp sums of squares kept as those of the staged kernel's warp c / 32 and added in its order,
// so that 1 / rms and x are its bits. Sum is read twice through L2 (4 KB), not held.
template <int kWarps>
__device__ __forceinline__ void StageNormedXAhead(const StagedGemvParams& p, bf16_t* xs) {
  constexpr int kThreads = kWarps * 32;
  __shared__ float warp_ss[kStagedWarps];
  const int t = threadIdx.x, lane = t % 32, chunks = p.k / 8;
#pragma unroll
  for (int j = 0; j < kVirtualPerWarp<kWarps>; ++j) {
    const int c = j * kThreads + t;
    float a[8] = {};
    if (c < chunks) LoadCg8(p.norm.sum + 8 * c, a);
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += a[i] * a[i];
    ss = WarpSum(ss);
    if (lane == 0) warp_ss[c / 32] = ss;
  }
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kStagedWarps; ++w) total += warp_ss[w];
  const float inv = rsqrtf(total / p.k + p.norm.eps);
  for (int c = t; c < chunks; c += kThreads) {
    float a[8];
    LoadCg8(p.norm.sum + 8 * c, a);
    const Bf16x8 xv = NormScale8(p.norm, 8 * c, a, inv);
    Store8(xs + 8 * c, xv);
    if (blockIdx.x == 0) Store8(p.norm.x + 8 * c, xv);
  }
  __syncthreads();  // xs staged
}

// The staged NormLinear's or Linear's CTA (GemvStagedKernel: the same rows a CTA, the same split
// into warps' rows, the same dots) on kWarps warps, each taking kVirtualPerWarp of its warps'
// rows. Before `go` lane 0 of each warp issues its virtual warps' bulk copies (the last
// global_warps only prefetch theirs into L2: the CTA then leaves more room on its SM); after it
// the CTA norms the sum into x (kNorm: NormLinearAhead) or copies x, multiplies, and counts
// itself out. The two ops are two functions, so that each keeps a carveout of its own.
template <int kWarps, bool kNorm>
__global__ void __launch_bounds__(kWarps * 32, 32 / kWarps) GemvAheadKernel(const __grid_constant__ AheadParams ap) {
  extern __shared__ __align__(128) unsigned char smem[];
  const StagedGemvParams& p = ap.g;
  TimelineScope tl(ap.g.timeline);  // beside the chain: waited = go seen
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int cta_row0 = blockIdx.x * p.rows_per_cta;
  const int cta_rows = min(p.rows_per_cta, p.n - cta_row0);
  const int first_global = kStagedWarps - ap.global_warps;
  bf16_t* xs = reinterpret_cast<bf16_t*>(smem + kStagedHeader);
  bf16_t* staged = reinterpret_cast<bf16_t*>(smem + kStagedHeader + p.x_bytes);
  if (ap.copy_at_await) {  // resident now, streaming once the await enters
    if (threadIdx.x == 0) wgmma::SpinUntil(&ap.signals->copy, 1u);
    __syncthreads();
  }
  if (lane == 0) {
    for (int v = warp; v < kStagedWarps; v += kWarps) {
      const StagedWarpRows r = SplitStagedRows(cta_rows, v);
      if (r.rows == 0) continue;
      const bf16_t* src = p.w + static_cast<int64_t>(cta_row0 + r.row0) * p.k;
      const uint32_t bytes = static_cast<uint32_t>(r.rows) * p.k * 2;
      if (v >= first_global) {
        wgmma::PrefetchL2(src, bytes, wgmma::EvictNormal());
        continue;
      }
      const uint32_t bar = wgmma::SmemAddr(smem + 8 * v);
      wgmma::MbarInit(bar, 1);
      wgmma::MbarInitFence();
      wgmma::MbarArriveExpectTx(bar, bytes);
      wgmma::BulkCopy(wgmma::SmemAddr(staged + static_cast<int64_t>(r.row0) * p.k), src, bytes, bar,
                      wgmma::EvictFirst());
    }
  }
  // Released by the await kernel once the kernels before it (the sum's writers) have completed.
  if (threadIdx.x == 0) wgmma::SpinUntil(&ap.signals->go, 1u);
  __syncthreads();
  tl.Waited();
  if constexpr (kNorm) {
    StageNormedXAhead<kWarps>(p, xs);
  } else {  // LinearAhead: x as the kernels before the await wrote it (through L2)
    for (int c = threadIdx.x; c < p.k / 8; c += kWarps * 32)
      reinterpret_cast<uint4*>(xs)[c] = __ldcg(reinterpret_cast<const uint4*>(p.x) + c);
    __syncthreads();
  }
  tl.Mark(0);  // x staged
  if (p.timeline != nullptr && threadIdx.x == 0 && first_global > 0 && SplitStagedRows(cta_rows, 0).rows > 0) {
    wgmma::MbarWait(wgmma::SmemAddr(smem), 0);
    tl.Mark(1);  // the first warp's rows landed (where that is after x: the copies were late)
  }
  for (int v = warp; v < kStagedWarps; v += kWarps) {
    const StagedWarpRows r = SplitStagedRows(cta_rows, v);
    if (r.rows == 0) continue;
    const bool in_smem = v < first_global;
    const bf16_t* ws = in_smem ? staged + static_cast<int64_t>(r.row0) * p.k
                               : p.w + static_cast<int64_t>(cta_row0 + r.row0) * p.k;
    MultiplyStaged(p, ws, xs, cta_row0 + r.row0, r.rows, in_smem, wgmma::SmemAddr(smem + 8 * v), lane);
  }
  __syncthreads();  // every output of this CTA stored
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&ap.signals->count, 1u) == gridDim.x - 1) {  // the last CTA
      ap.signals->count = 0;
      wgmma::StoreRelease(&ap.signals->done, 1u);
    }
  }
}

// early_trigger (Tuning().ahead_await_early_trigger): the next kernel may launch once go is
// raised, so that its CTAs wait resident for this one's completion instead of launching after
// it; they then hold room beside the ahead CTAs, which by then have all been placed unless the
// kernels before the await kept SMs from them (the next kernel's CTAs take a few SMs' room).
// raise_go false: a kernel before this one raised go (the MoE's down kernel).
// raise_copy (Tuning().ahead_copy_at_await): the op's copies start as this kernel enters, i.e.
// once the kernel before it has triggered its dependents (the decode attention after its
// passes, attention_decode_trigger 2), not at the op's issue, in front of the chain's loads.
// (A write before the dependency wait, which pdl.cuh's contract rules out for the step's data:
// the flag is read only by the op's CTAs, and the last await to re-arm it completed before the
// op's launch on the side stream, forked after it.)
__global__ void __launch_bounds__(32) AwaitAheadKernel(AheadSignals* signals, uint64_t* timeline,
                                                       bool early_trigger, bool raise_go, bool raise_copy) {
  TimelineScope tl(timeline);
  if (raise_copy && threadIdx.x == 0) wgmma::StoreRelease(&signals->copy, 1u);
  GridDependencyWait();  // every kernel before this one (the sum's last writer) has completed
  tl.Waited();
  if (threadIdx.x != 0) return;
  if (raise_go) wgmma::StoreRelease(&signals->go, 1u);
  if (early_trigger) TriggerDependents();
  wgmma::SpinUntil(&signals->done, 1u);
  // Re-armed for the next op: its kernel starts after this one has completed.
  signals->go = 0;
  signals->done = 0;
  signals->copy = 0;
}

std::atomic<int64_t> ahead_launches{0};  // AheadLaunches

struct AheadPlan {
  int sms = 0, sm_smem = 0;  // the device's SMs and shared memory an SM
  int64_t rows_per_cta = 0, x_bytes = 0, smem = 0;
  int global_warps = 0;
};

// LaunchStagedGemv's split (the same rows a CTA and a warp: the same bits), less the shared
// memory of the warps that read from global memory (the last ones, which hold the fewest rows).
AheadPlan PlanAhead(int64_t n, int64_t k) {
  AheadPlan plan;
  int device = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&plan.sms, cudaDevAttrMultiProcessorCount, device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&plan.sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  plan.rows_per_cta = (n + plan.sms - 1) / plan.sms;
  plan.x_bytes = (2 * k + 127) / 128 * 128;
  plan.global_warps = std::clamp(Tuning().ahead_global_warps, 0, kStagedWarps - 1);
  // The staged rows: those before the first warp from global memory.
  const int64_t staged_rows =
      SplitStagedRows(static_cast<int>(plan.rows_per_cta), kStagedWarps - plan.global_warps).row0;
  plan.smem = kStagedHeader + plan.x_bytes + staged_rows * k * 2;
  return plan;
}

}  // namespace

AheadSignals* NewAheadSignals() {
  AheadSignals* s = nullptr;
  COROLLA_CUDA_CHECK(cudaMalloc(&s, sizeof(AheadSignals)));
  COROLLA_CUDA_CHECK(cudaMemset(s, 0, sizeof(AheadSignals)));
  return s;
}

namespace {

template <int kWarps, bool kNorm>
void LaunchAheadKernel(const AheadParams& ap, int ctas, int64_t smem, int carveout, cudaStream_t side) {
  const void* kernel = reinterpret_cast<const void*>(GemvAheadKernel<kWarps, kNorm>);
  static const bool attrs_set = [kernel] {  // (one device a process takes the ahead ops: CudaBackend)
    COROLLA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kStagedMaxSmem)));
    return true;
  }();
  (void)attrs_set;
  SetCarveoutOnce(kernel, carveout);
  GemvAheadKernel<kWarps, kNorm><<<ctas, kWarps * 32, static_cast<size_t>(smem), side>>>(ap);
  COROLLA_CUDA_CHECK(cudaGetLastError());
}

// GemvAheadKernel on `side` for p (x, w, out, n, k, norm or none), at the plan's split.
void LaunchAhead(StagedGemvParams p, AheadSignals* signals, cudaStream_t side) {
  const AheadPlan plan = PlanAhead(p.n, p.k);
  p.rows_per_cta = static_cast<int>(plan.rows_per_cta);
  p.x_bytes = static_cast<int>(plan.x_bytes);
  const int ctas = CeilDiv(p.n, plan.rows_per_cta);
  if (TimelineOn())
    p.timeline = TimelineRecordBeside(std::string(p.norm.sum ? "NormLinear ahead " : "Linear ahead ") +
                                          std::to_string(p.k) + "->" + std::to_string(p.n),
                                      ctas, side);
  const AheadParams ap{p, signals, plan.global_warps, Tuning().ahead_copy_at_await};
  // The carveout (Tuning().ahead_carveout, else): qkv's, the least that holds its CTA (its shared
  // memory and the 1 KB the SM reserves a CTA), so that the rest is L1 and room for the MoE's
  // CTAs; o_proj's, all of it. At the least carveout o_proj's op trapped in the bench's first
  // graph replay (session 50, H100, ctx 1024), most likely for room: its ~129 KB CTAs on 128 of
  // 132 SMs, each SM at the 132 KB configuration, leave none for the attention it waits through,
  // whose CTAs launch as clusters needing room on several SMs of one GPC at once.
  const bool norm = p.norm.sum != nullptr;
  int carveout = Tuning().ahead_carveout;
  if (carveout < 0 && !norm) carveout = 100;
  if (carveout < 0)
    carveout = static_cast<int>(std::min<int64_t>(100, CeilDiv((plan.smem + 1024) * 100, plan.sm_smem)));
  const bool eight = Tuning().ahead_warps == 8;
  if (norm && eight) LaunchAheadKernel<8, true>(ap, ctas, plan.smem, carveout, side);
  else if (norm) LaunchAheadKernel<4, true>(ap, ctas, plan.smem, carveout, side);
  else if (eight) LaunchAheadKernel<8, false>(ap, ctas, plan.smem, carveout, side);
  else LaunchAheadKernel<4, false>(ap, ctas, plan.smem, carveout, side);
  ahead_launches.fetch_add(1, std::memory_order_relaxed);
}

// The plan fits one CTA an SM (w [N, K] bf16, contiguous, 16-byte aligned; N < 2^30).
bool AheadFits(const TensorView& w) {
  return Tuning().gemv_staged && w.dtype == DType::kBF16 && w.rank() == 2 && w.dim(0) <= (int64_t{1} << 30) &&
         w.dim(1) % 8 == 0 && w.is_contiguous() && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
         PlanAhead(w.dim(0), w.dim(1)).smem <= kStagedMaxSmem;
}

}  // namespace

bool NormLinearAheadFits(const TensorView& norm_w, float eps, const TensorView& sum, const TensorView& x,
                         const TensorView& w, const TensorView& out) {
  if (x.rank() != 2 || x.dim(0) != 1 || !AheadFits(w)) return false;
  ResidualNorm norm;
  return StagedNormFits(x, w, out, MakeResidualNorm(nullptr, norm_w, eps, sum, x, &norm));
}

void NormLinearAhead(const TensorView& norm_w, float eps, const TensorView& sum, const TensorView& x,
                     const TensorView& w, const TensorView& out, AheadSignals* signals, cudaStream_t side) {
  ResidualNorm norm;
  COROLLA_CHECK(NormLinearAheadFits(norm_w, eps, sum, x, w, out) &&
                MakeResidualNorm(nullptr, norm_w, eps, sum, x, &norm))
      << "NormLinearAhead x " << x.ToString() << " w " << w.ToString() << " out " << out.ToString();
  LaunchAhead({x.ptr<bf16_t>(), w.ptr<bf16_t>(), out.data, static_cast<int>(w.dim(0)), static_cast<int>(w.dim(1)), 0,
               0, out.dtype == DType::kF32, nullptr, norm, nullptr},
              signals, side);
}

bool LinearAheadFits(const TensorView& x, const TensorView& w, const TensorView& out) {
  return AheadFits(w) && x.dtype == DType::kBF16 && x.rank() == 2 && x.dim(0) == 1 && x.dim(1) == w.dim(1) &&
         x.is_contiguous() && reinterpret_cast<uintptr_t>(x.data) % 16 == 0 &&
         (out.dtype == DType::kBF16 || out.dtype == DType::kF32) && out.rank() == 2 && out.dim(0) == 1 &&
         out.dim(1) == w.dim(0) && out.strides[1] == 1;
}

void LinearAhead(const TensorView& x, const TensorView& w, const TensorView& out, AheadSignals* signals,
                 cudaStream_t side) {
  COROLLA_CHECK(LinearAheadFits(x, w, out))
      << "LinearAhead x " << x.ToString() << " w " << w.ToString() << " out " << out.ToString();
  LaunchAhead({x.ptr<bf16_t>(), w.ptr<bf16_t>(), out.data, static_cast<int>(w.dim(0)), static_cast<int>(w.dim(1)), 0,
               0, out.dtype == DType::kF32, nullptr, ResidualNorm{}, nullptr},
              signals, side);
}

int64_t AheadLaunches() { return ahead_launches.load(std::memory_order_relaxed); }

unsigned* AheadGoFlag(AheadSignals* signals) { return &signals->go; }
unsigned* AheadMoeArrivals(AheadSignals* signals) { return &signals->moe_arrivals; }

void AwaitAhead(AheadSignals* signals, cudaStream_t s, bool go_raised) {
  uint64_t* timeline = TimelineOn() ? TimelineRecord("Await ahead", 1, s) : nullptr;
  LaunchPdl(AwaitAheadKernel, dim3(1), dim3(32), 0, s, 1, signals, timeline, Tuning().ahead_await_early_trigger,
            !go_raised, Tuning().ahead_copy_at_await);
}

}  // namespace corolla::cuda
