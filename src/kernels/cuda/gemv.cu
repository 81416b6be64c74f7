// Linear for a few rows of x: memory-bound, so the kernel is a weight stream. Each warp owns
// kRows rows of W [N, K]; every lane loads its 16-byte chunks of those rows (two passes of
// kUnroll chunks ahead of the arithmetic) and multiplies them with the same chunks of each of the M rows of
// x (read through L1: every warp of the grid reads the same few rows). Warp reductions give
// out[m, n] for the warp's rows, written by lane m * kRows + r.
//
// One row of x whose CTA slices fit in shared memory (the dense projections of a batch-1 decode
// step) takes GemvStagedKernel instead: one CTA an SM stages its whole slice of W by bulk copies
// issued before the dependency wait, so under programmatic dependent launch the weights stream
// while the kernels before it run (attention, norms) and the multiply after the wait only reads
// shared memory.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_staged.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/timeline.cuh"
#include "kernels/cuda/timeline.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kLoadsInFlight = 8;  // 16-byte weight loads per lane issued before their arithmetic
constexpr int kOneWaveBlocks = 5;  // CTAs an SM must hold for GemvKernel<1, 2>'s grids to be one wave

struct GemvParams {
  const bf16_t* x;
  int64_t x_stride;
  const bf16_t* w;
  void* out;
  int64_t out_stride;
  int m, n, k;
  bool out_f32;
  uint64_t* timeline = nullptr;  // timeline.h
};

// kRows rows of W per warp (fewer rows, more CTAs: the host picks kRows so that small N still
// fills the GPU). Software-pipelined: a pass of kLoadsInFlight / kRows chunks of each row is in
// flight while the previous pass is multiplied, so each lane has up to 2 kLoadsInFlight 16-byte
// loads outstanding. The first pass is issued before GridDependencyWait (weights are not written
// by any kernel): under programmatic dependent launch it overlaps the previous kernel's tail.
// kMinBlocks > 1 caps the registers so that many CTAs fit an SM (kOneWaveBlocks below).
template <int kM, int kRows, int kMinBlocks = 1>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) GemvKernel(const __grid_constant__ GemvParams p) {
  TimelineScope tl(p.timeline);
  constexpr int kUnroll = kLoadsInFlight / kRows;
  constexpr int kPass = kUnroll * 32 * 8;  // columns of a row one pass of the warp covers
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = (blockIdx.x * kWarps + warp) * kRows;
  const bool active = n0 < p.n;
  const bf16_t* rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = p.w + static_cast<int64_t>(min(n0 + r, p.n - 1)) * p.k;
  // Chunks c0 + j * 256 (j < kUnroll) of each row; those past K are left unloaded (and unused).
  auto load_pass = [&](int c0, Bf16x8 (&wv)[kUnroll][kRows]) {
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int c = c0 + j * 32 * 8;
      if (c >= p.k) break;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const uint4 u = __ldcs(reinterpret_cast<const uint4*>(rows[r] + c));  // read once: stream past the caches
        memcpy(&wv[j][r], &u, sizeof(u));
      }
    }
  };
  Bf16x8 wv[kUnroll][kRows];
  if (active) load_pass(lane * 8, wv);
  GridDependencyWait();  // x is the previous kernel's output
  tl.Waited();
  TriggerDependents();
  if (!active) return;
  float acc[kM][kRows] = {};
  // With one or two rows of x, their chunks are loaded at the start of the pass (before any
  // use); more rows are read at their use (registers).
  constexpr bool kPrefetchX = kM <= 2;
  for (int c0 = lane * 8; c0 < p.k; c0 += kPass) {
    Bf16x8 xv[kUnroll][kPrefetchX ? kM : 1];
    if constexpr (kPrefetchX)
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int c = c0 + j * 32 * 8;
        if (c >= p.k) break;
#pragma unroll
        for (int m = 0; m < kM; ++m)
          if (m < p.m) xv[j][m] = *reinterpret_cast<const Bf16x8*>(p.x + m * p.x_stride + c);
      }
    Bf16x8 next[kUnroll][kRows];
    const bool more = c0 + kPass < p.k;
    if (more) load_pass(c0 + kPass, next);
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int c = c0 + j * 32 * 8;
      if (c >= p.k) break;
      float wf[kRows][8];
#pragma unroll
      for (int r = 0; r < kRows; ++r) Unpack8(wv[j][r], wf[r]);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        if (m >= p.m) break;
        float xf[8];
        if constexpr (kPrefetchX) Unpack8(xv[j][m], xf);
        else Unpack8(*reinterpret_cast<const Bf16x8*>(p.x + m * p.x_stride + c), xf);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[m][r] = fmaf(wf[r][i], xf[i], acc[m][r]);
      }
    }
    if (more)
#pragma unroll
      for (int j = 0; j < kUnroll; ++j)
#pragma unroll
        for (int r = 0; r < kRows; ++r) wv[j][r] = next[j][r];
  }
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[m][r] = WarpSum(acc[m][r]);
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (lane != m * kRows + r || m >= p.m || n0 + r >= p.n) continue;
      const int64_t o = m * p.out_stride + n0 + r;
      if (p.out_f32) static_cast<float*>(p.out)[o] = acc[m][r];
      else static_cast<bf16_t*>(p.out)[o] = __float2bfloat16(acc[m][r]);
    }
}

// COROLLA_GEMV_STAGED_TRACE=S prints the CTA timeline of the staged launches S + 1 .. S + 6 of
// the process that run outside a graph capture (each is followed by a stream synchronisation).
void TraceStaged(const StagedGemvParams& p, int ctas, cudaStream_t s) {
  std::vector<uint64_t> t(static_cast<size_t>(ctas) * 6);
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(s));
  COROLLA_CUDA_CHECK(cudaMemcpy(t.data(), p.trace, t.size() * 8, cudaMemcpyDeviceToHost));
  uint64_t e0 = ~0ull;
  for (int c = 0; c < ctas; ++c) e0 = std::min(e0, t[c * 6]);
  std::string line = "staged gemv trace N" + std::to_string(p.n) + " K" + std::to_string(p.k) + " ctas " +
                     std::to_string(ctas) + " (us after the first entry, min/median/max):";
  auto add = [&](const char* name, std::vector<double> v, const char* format) {
    std::sort(v.begin(), v.end());
    char buf[96];
    std::snprintf(buf, sizeof(buf), format, name, v.front(), v[v.size() / 2], v.back());
    line += buf;
  };
  static const char* const kNames[4] = {"entry", "wait", "landed", "end"};
  for (int e = 0; e < 4; ++e) {
    std::vector<double> v;
    for (int c = 0; c < ctas; ++c) v.push_back((t[c * 6 + e] - e0) * 1e-3);
    add(kNames[e], v, " %s %.2f/%.2f/%.2f");
  }
  std::vector<double> mhz;  // SM cycles over nanoseconds from staged to end, x 1000
  for (int c = 0; c < ctas; ++c) {
    const uint64_t ns = t[c * 6 + 3] - t[c * 6 + 2], cycles = t[c * 6 + 5] - t[c * 6 + 4];
    if (ns > 0) mhz.push_back(1e3 * static_cast<double>(cycles) / static_cast<double>(ns));
  }
  if (!mhz.empty()) add("sm MHz", mhz, " | %s %.0f/%.0f/%.0f");
  std::fprintf(stderr, "%s\n", line.c_str());
}

// The streams whose last decode attention folded its prologue in. A launch setting follows the
// kernel that runs beside this one, which Linear's arguments do not carry, so the attention ops
// record it per stream (ops.h, SetStagedGemvBesideFoldedAttention).
std::mutex beside_mu;
std::set<cudaStream_t> beside_streams;  // GUARDED_BY(beside_mu)
std::atomic<int64_t> beside_launches{0};  // StagedGemvBesideLaunches

bool StagedGemvBesideFoldedAttention(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(beside_mu);
  return beside_streams.count(s) != 0;
}

// A routing prediction for `hint` over at most `max_ctas` CTAs (MoePredictParams), or none (picks
// null) where the shapes rule it out: softmax routing's top k <= 16 of E <= kMoePredictionMaxExperts
// experts, E / R CTAs of R rows (R dividing kStagedWarps and E), 16-byte aligned rows.
MoePredictParams MoePrediction(const MoeRouteHint& hint, int max_ctas, cudaStream_t s) {
  MoePredictParams p;
  const TensorView &r = hint.router, &n = hint.norm_w, &h = hint.sum;
  const int64_t experts = r.rank() == 2 ? r.dim(0) : 0, hidden = r.rank() == 2 ? r.dim(1) : 0;
  auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (experts < 1 || experts > kMoePredictionMaxExperts || hint.top_k < 1 || hint.top_k > 16 ||
      hint.top_k > experts || hidden % 8 != 0 || r.dtype != DType::kBF16 || !r.is_contiguous() ||
      h.dtype != DType::kBF16 || h.numel() != hidden || h.strides[h.rank() - 1] != 1 ||
      (n.dtype != DType::kBF16 && n.dtype != DType::kF32) || n.numel() != hidden || !aligned(r.data) ||
      !aligned(h.data) || !aligned(n.data))
    return p;
  int rows = 1;
  while (rows < kStagedWarps && (experts % rows != 0 || experts / rows > std::max(1, max_ctas))) rows *= 2;
  if (experts % rows != 0 || experts / rows > std::max(1, max_ctas)) return p;
  int32_t* picks = MoePredictedPicks(s);
  if (picks == nullptr) return p;
  p.router = r.ptr<bf16_t>();
  p.norm_w = n.data;
  p.norm_f32 = n.dtype == DType::kF32;
  p.sum = h.ptr<bf16_t>();
  p.picks = picks;
  p.experts = static_cast<int>(experts);
  p.hidden = static_cast<int>(hidden);
  p.top_k = hint.top_k;
  p.ctas = static_cast<int>(experts / rows);
  p.tag = NextMoePredictionTag(s);
  return p;
}

bool ExpertPrefetchOn() { return Tuning().moe_prefetch_qkv > 0 || Tuning().moe_prefetch_qkv_down > 0; }

// Tuning().moe_prefetch_qkv(_down)'s prefetches for `hint`'s experts (bf16 [E, 2I, H] and
// [E, H, I], 16-byte aligned rows), or none (picks null) where they are off or do not apply.
// The picks: MoePredictKernel's of launch `tag`, or with tag 0 the last forward's.
ExpertL2Prefetch ExpertPrefetch(const MoeRouteHint& hint, int tag, cudaStream_t s) {
  ExpertL2Prefetch f;
  const TensorView &gu = hint.gate_up, &dn = hint.down;
  if (!ExpertPrefetchOn() || (Tuning().moe_prefetch_qkv_predict && tag == 0)) return f;
  if (gu.rank() != 3 || dn.rank() != 3 || gu.dtype != DType::kBF16 || dn.dtype != DType::kBF16 ||
      !gu.is_contiguous() || !dn.is_contiguous() || gu.dim(0) != dn.dim(0) || gu.dim(1) != 2 * dn.dim(2) ||
      gu.dim(2) != dn.dim(1) || gu.dim(2) % 8 != 0 || dn.dim(2) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(gu.data) % 16 != 0 || reinterpret_cast<uintptr_t>(dn.data) % 16 != 0)
    return f;
  f.experts = static_cast<int>(gu.dim(0));
  f.hidden = static_cast<int>(gu.dim(2));
  f.inter = static_cast<int>(dn.dim(2));
  f.top_k = hint.top_k;
  f.gate_up_rows = std::clamp(Tuning().moe_prefetch_qkv, 0, f.inter);
  f.down_rows = std::clamp(Tuning().moe_prefetch_qkv_down, 0, f.hidden);
  f.gate_up = gu.ptr<bf16_t>();
  f.down = dn.ptr<bf16_t>();
  f.evict_last = Tuning().moe_prefetch_qkv_last;
  f.tag = tag;
  f.picks = tag != 0 ? MoePredictedPicks(s) : MoePreviousPicks(gu.data, hint.top_k, s);
  return f;
}

// Tuning().moe_prefetch_qkv_predict: the layer's routing predicted from its input (sum, the
// previous kernel's output) just before its qkv projection, whose CTAs it lets in at once.
struct MoePredictLaunch {
  MoePredictParams pred;
  uint64_t* timeline = nullptr;  // timeline.h
};
__global__ void __launch_bounds__(kStagedWarps * 32) MoePredictKernel(const __grid_constant__ MoePredictLaunch p) {
  TimelineScope tl(p.timeline);
  TriggerDependents();  // qkv's CTAs issue their copies beside this
  PredictChunk q = PredictLoads(p.pred, /*with_sum=*/false);
  GridDependencyWait();  // sum is the previous kernel's output
  tl.Waited();
  if (q.c < p.pred.hidden) q.h = __ldcg(reinterpret_cast<const uint4*>(p.pred.sum + q.c));
  PredictMoeRouting(p.pred, q);
}

// Launches MoePredictKernel for `hint` where it applies: its tag, else 0.
int LaunchMoePredict(const MoeRouteHint& hint, cudaStream_t s) {
  MoePredictLaunch p{MoePrediction(hint, 16, s)};
  if (p.pred.picks == nullptr) return 0;
  p.timeline = TimelineRecord("MoePredict", p.pred.ctas, s);
  LaunchPdl(MoePredictKernel, dim3(p.pred.ctas), dim3(kStagedWarps * 32), 0, s, 1, p);
  return p.pred.tag;
}

// Launches GemvStagedKernel when one row of x makes every CTA's slice fit kStagedMaxSmem with
// one CTA an SM; false leaves the call to GemvKernel.
bool LaunchStagedGemv(const TensorView& x, const TensorView& w, const TensorView& out, cudaStream_t s,
                      const ResidualNorm* norm = nullptr, unsigned* arrivals = nullptr,
                      const MoeRouteHint* hint = nullptr, const MoeRouteHint* prefetch_hint = nullptr,
                      int prefetch_tag = 0) {
  const int64_t n = w.dim(0), k = w.dim(1);
  if (!Tuning().gemv_staged || x.dim(0) != 1 || n > (int64_t{1} << 30)) return false;
  int device = 0, sms = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t rows_per_cta = (n + sms - 1) / sms, x_bytes = (2 * k + 127) / 128 * 128;
  const int64_t smem = kStagedHeader + x_bytes + rows_per_cta * k * 2;
  if (smem > kStagedMaxSmem) return false;
  // Function attributes are per device: opt in to the shared memory once on each.
  static std::atomic<uint64_t> attrs_set{0};
  const uint64_t device_bit = uint64_t{1} << (device % 64);
  if (!(attrs_set.load(std::memory_order_acquire) & device_bit)) {
    for (const auto kernel : {GemvStagedKernel<false>, GemvStagedKernel<true>, GemvStagedKernel<false, true>})
      COROLLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(kStagedMaxSmem)));
    attrs_set.fetch_or(device_bit, std::memory_order_acq_rel);
  }
  StagedGemvParams p{x.ptr<bf16_t>(), w.ptr<bf16_t>(), out.data, static_cast<int>(n), static_cast<int>(k),
                     static_cast<int>(rows_per_cta), static_cast<int>(x_bytes), out.dtype == DType::kF32, nullptr,
                     norm ? *norm : ResidualNorm{}, arrivals};
  p.spread_ns = Tuning().gemv_staged_spread_ns;
  p.depth = norm ? Tuning().gemv_staged_depth_norm : Tuning().gemv_staged_depth;
  const int ctas = CeilDiv(n, rows_per_cta);
  static const char* trace_env = std::getenv("COROLLA_GEMV_STAGED_TRACE");
  bool traced = false;
  if (trace_env) {  // a debugging aid (see TraceStaged): never inside a capture
    static uint64_t* trace_buf = nullptr;
    static std::atomic<int> launches{0};
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    COROLLA_CUDA_CHECK(cudaStreamIsCapturing(s, &cap));
    const int skip = std::atoi(trace_env);
    if (cap == cudaStreamCaptureStatusNone) {
      const int i = ++launches;
      if (i > skip && i <= skip + 6) {
        if (!trace_buf) COROLLA_CUDA_CHECK(cudaMalloc(&trace_buf, sizeof(uint64_t) * 6 * sms));
        p.trace = trace_buf;
        traced = true;
      }
    }
  }
  if (TimelineOn()) {
    const char* name = !norm ? "Gemv staged " : norm->y ? "RmsNormLinear staged " : "NormLinear staged ";
    p.timeline = TimelineRecord(name + std::to_string(k) + "->" + std::to_string(n), ctas, s);
  }
  const bool beside = StagedGemvBesideFoldedAttention(s);
  // (o_proj's prediction: among the grid's first half)
  if (hint != nullptr && norm == nullptr && !beside && Tuning().moe_predict && Tuning().moe_prefetch_previous > 0)
    p.pred = MoePrediction(*hint, ctas / 2, s);
  if (prefetch_hint != nullptr) p.l2 = ExpertPrefetch(*prefetch_hint, prefetch_tag, s);
  const auto kernel = beside                       ? GemvStagedKernel<true>
                      : p.pred.picks != nullptr ? GemvStagedKernel<false, true>
                                                : GemvStagedKernel<false>;
  if (beside) beside_launches.fetch_add(1, std::memory_order_relaxed);
  SetCarveoutOnce(reinterpret_cast<const void*>(kernel),
                  beside ? Tuning().gemv_staged_carveout_folded : Tuning().gemv_staged_carveout);
  LaunchPdl(kernel, dim3(ctas), dim3(kStagedWarps * 32), static_cast<size_t>(smem), s, 1, p);
  if (traced) TraceStaged(p, ctas, s);
  return true;
}

}  // namespace

int64_t StagedGemvBesideLaunches() { return beside_launches.load(std::memory_order_relaxed); }

void SetStagedGemvBesideFoldedAttention(cudaStream_t s, bool folded) {
  std::lock_guard<std::mutex> lock(beside_mu);
  if (folded) beside_streams.insert(s);
  else beside_streams.erase(s);
}

bool LinearGemv(const TensorView& x, const TensorView& w, const TensorView& out, cudaStream_t s,
                const MoeRouteHint* hint) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  if (m > Tuning().linear_gemv_max_rows) return false;
  COROLLA_CHECK(x.dtype == DType::kBF16 && w.dtype == DType::kBF16 &&
                (out.dtype == DType::kBF16 || out.dtype == DType::kF32) && x.rank() == 2 && w.rank() == 2 &&
                out.rank() == 2 && w.dim(1) == k && out.dim(0) == m && out.dim(1) == n && w.is_contiguous() &&
                x.strides[1] == 1 && out.strides[1] == 1)
      << "linear x " << x.ToString() << " w " << w.ToString() << " out " << out.ToString();
  if (m < 1 || m > 8 || m > Tuning().linear_gemv_max_rows || k % 8 != 0 ||
      reinterpret_cast<uintptr_t>(x.data) % 16 != 0 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0 ||
      (m > 1 && x.strides[0] % 8 != 0))
    return false;
  if (LaunchStagedGemv(x, w, out, s, nullptr, nullptr, hint)) return true;
  GemvParams p{x.ptr<bf16_t>(), m > 1 ? x.strides[0] : k, w.ptr<bf16_t>(), out.data, m > 1 ? out.strides[0] : n,
               static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), out.dtype == DType::kF32};
  // Rows per warp: 4 while that leaves >= 4 CTAs per SM (132 SMs), else 2, else 1.
  const int rows = n >= 4 * 132 * kWarps * 4 ? 4 : n >= 4 * 132 * kWarps * 2 ? 2 : 1;
  auto launch = [&](auto m_tag, auto rows_tag) {
    constexpr int kM = decltype(m_tag)::value, kRows = decltype(rows_tag)::value;
    const dim3 grid(CeilDiv(n, kWarps * kRows));
    if (TimelineOn()) p.timeline = TimelineRecord("Gemv " + std::to_string(k) + "->" + std::to_string(n), grid.x, s);
    // One row, two rows a warp (the 4224 <= N < 8448 band: qkv at Qwen3-30B-A3B, 640 CTAs): at
    // 102 registers 4 CTAs fit an SM (528 on an H200), so the grid ran in two waves; capped at
    // 96 (no spills) 5 fit and it is one.
    if constexpr (kM == 1 && kRows == 2) {
      if (Tuning().gemv_one_wave) {
        LaunchPdl(GemvKernel<kM, kRows, kOneWaveBlocks>, grid, dim3(kWarps * 32), 0, s, 1, p);
        return;
      }
    }
    LaunchPdl(GemvKernel<kM, kRows>, grid, dim3(kWarps * 32), 0, s, 1, p);
  };
  auto with_rows = [&](auto m_tag) {
    if (rows == 4) launch(m_tag, std::integral_constant<int, 4>{});
    else if (rows == 2) launch(m_tag, std::integral_constant<int, 2>{});
    else launch(m_tag, std::integral_constant<int, 1>{});
  };
  if (m == 1) with_rows(std::integral_constant<int, 1>{});
  else if (m == 2) with_rows(std::integral_constant<int, 2>{});
  else if (m <= 4) with_rows(std::integral_constant<int, 4>{});
  else with_rows(std::integral_constant<int, 8>{});
  return true;
}

bool RmsNormLinear(const TensorView& y, const TensorView& norm_w, float eps, const TensorView& sum, const TensorView& x,
                   const TensorView& w, const TensorView& out, cudaStream_t s) {
  if (!Tuning().gemv_staged_norm || x.rank() != 2 || x.dim(0) != 1) return false;
  ResidualNorm norm;
  if (!StagedNormFits(x, w, out, MakeResidualNorm(&y, norm_w, eps, sum, x, &norm))) return false;
  auto* arrivals = static_cast<unsigned*>(StreamScratch(s, StreamScratchSlot::kStagedGemvNorm, 16));
  return arrivals != nullptr && LaunchStagedGemv(x, w, out, s, &norm, arrivals);
}

bool NormLinear(const TensorView& norm_w, float eps, const TensorView& sum, const TensorView& x, const TensorView& w,
                const TensorView& out, cudaStream_t s, const MoeRouteHint* hint) {
  if (x.rank() != 2 || x.dim(0) != 1) return false;
  ResidualNorm norm;
  if (!StagedNormFits(x, w, out, MakeResidualNorm(nullptr, norm_w, eps, sum, x, &norm))) return false;
  const int tag = hint != nullptr && Tuning().moe_prefetch_qkv_predict && ExpertPrefetchOn() ? LaunchMoePredict(*hint, s) : 0;
  return LaunchStagedGemv(x, w, out, s, &norm, nullptr, nullptr, hint, tag);  // (norm.y null: StageNormedX<true>)
}

}  // namespace corolla::cuda
