// MoE experts of a few tokens as plain GEMVs over (token, expert) pairs: no count, scan or
// permute, and the weighted combine folded into the down projection (see moe_decode.h).
// Each warp streams a few weight rows with 16-byte loads, every lane holding its share of K;
// the input row (x or the pair's activations) is read from global memory, where every warp of
// the grid reading the same row keeps it in L1/L2.
#include <cuda_fp8.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_decode.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/cuda/timeline.cuh"
#include "kernels/cuda/timeline.h"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kGateUpN = 2;   // outputs n per warp: gate rows n and up rows I + n, 4 rows in flight
constexpr int kDownRows = 2;  // rows h of W_down per warp
constexpr int kUnroll = 4;    // 8-element chunks per lane loaded ahead of the arithmetic

// Weights are read once per step: bypass L1 and mark them first to evict from L2.
__device__ __forceinline__ Bf16x8 LoadStreaming(const bf16_t* p) {
  Bf16x8 v;
  uint4 u = __ldcs(reinterpret_cast<const uint4*>(p));
  memcpy(&v, &u, sizeof(v));
  return v;
}

struct PairGemvParams {
  const bf16_t* x;
  int64_t x_stride;
  const int32_t* ids;
  int64_t ids_stride;
  const float* weights;
  int64_t weights_stride;
  const bf16_t* w_gate_up;  // [E, 2I, H]
  const bf16_t* w_down;     // [E, H, I]
  float* act;               // [T * k, I]
  bf16_t* out;
  int64_t out_stride;
  int experts, top_k, hidden, inter;
  uint64_t* timeline = nullptr;  // timeline.h (set per launch)
  bf16_t* residual = nullptr;    // PairDownSlotsKernel: residual += out (MoeExpertsResidual)
  int64_t residual_stride = 0;
  // One token (Tuning().moe_prefetch_previous): the picks PairGateUpKernel prefetches before its
  // wait: the layer's of the last forward, which PairDownSlotsKernel records after its own wait
  // (record), or the prediction o_proj's CTAs made (Tuning().moe_predict: MoePredictedPicks,
  // where this layer's o_proj launch left a tag).
  const int32_t* predicted = nullptr;
  int32_t* record = nullptr;
  unsigned* hits = nullptr;  // with the prediction: [0] picks, [1] of them predicted (down kernel)
  bool prefetch_ahead = false;  // Tuning().moe_prefetch_previous >= 2
  bool gate_up_prefetch = true;  // whether gate/up prefetches `predicted` (else only counted)
};

// kN outputs a warp, kU chunks a lane in flight per row (Tuning().moe_pair_gate_up_rows).
// kOneWave (Tuning().moe_pair_gate_up_one_wave): the token's x row in shared memory (dynamic,
// hidden x 2 bytes) instead of registers, and registers capped for 6 CTAs an SM, so that
// Qwen3-30B-A3B's 768 batch-1 CTAs are resident at once (4 an SM otherwise: 106 registers).
template <int kN = kGateUpN, int kU = kUnroll, bool kOneWave = false>
__global__ void __launch_bounds__(kWarps * 32, kOneWave ? 6 : 0)
    PairGateUpKernel(const __grid_constant__ PairGemvParams p) {
  extern __shared__ __align__(16) unsigned char x_smem[];  // kOneWave only
  TimelineScope tl(p.timeline);
  // One token: blockIdx.x is the slot. Its rows, and with ahead those of the CTA half a grid
  // further (in the second wave at Qwen3-30B-A3B's 768 CTAs) from the first half.
  const int ahead = p.predicted != nullptr && p.prefetch_ahead && blockIdx.y < gridDim.y / 2 ? 2 : 1;
  const bool prefetches = p.predicted != nullptr && p.gate_up_prefetch;
  // o_proj's prediction is complete: it ends before o_proj's CTAs wait, and this grid was
  // launched by the norm-router's trigger after that router's wait on o_proj (session 56: a wait
  // for its tag here cost an L2 round trip before every CTA's prefetch). The tag beside the picks
  // only says which launch wrote them (tests).
  if (prefetches && threadIdx.x < ahead) {
    const int e = reinterpret_cast<const volatile int32_t*>(p.predicted)[blockIdx.x],
              n0 = (blockIdx.y + threadIdx.x * (gridDim.y / 2)) * kWarps * kN;
    if (e >= 0 && e < p.experts && n0 < p.inter && p.hidden % 8 == 0) {
      const uint32_t bytes = static_cast<uint32_t>(min(kWarps * kN, p.inter - n0) * p.hidden * 2);
      const bf16_t* w = p.w_gate_up + static_cast<int64_t>(e) * 2 * p.inter * p.hidden;
      wgmma::PrefetchL2(w + static_cast<int64_t>(n0) * p.hidden, bytes, wgmma::EvictNormal());  // gate rows
      wgmma::PrefetchL2(w + static_cast<int64_t>(p.inter + n0) * p.hidden, bytes, wgmma::EvictNormal());  // up
    }
  }
  GridDependencyWait();  // launched with programmatic dependent launch (pdl.cuh): ids come from routing
  tl.Waited();
  TriggerDependents();
  const int pair = blockIdx.x;
  const int t = pair / p.top_k, slot = pair % p.top_k;
  const int e = p.ids[t * p.ids_stride + slot];
  if (e < 0 || e >= p.experts) return;  // another rank's expert: the down kernel skips it too
  if constexpr (kOneWave) {  // (before any warp may leave)
    const bf16_t* xr = p.x + t * p.x_stride;
    for (int c = threadIdx.x * 8; c < p.hidden; c += kWarps * 32 * 8)
      *reinterpret_cast<uint4*>(x_smem + 2 * c) = *reinterpret_cast<const uint4*>(xr + c);
    __syncthreads();
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = (blockIdx.y * kWarps + warp) * kN;
  if (n0 >= p.inter) return;
  const bf16_t* w = p.w_gate_up + static_cast<int64_t>(e) * 2 * p.inter * p.hidden;
  // Rows 2i: gate n0 + i, 2i + 1: up n0 + i; outputs past I repeat a valid row, dropped below.
  const bf16_t* rows[2 * kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const int n = min(n0 + i, p.inter - 1);
    rows[2 * i] = w + static_cast<int64_t>(n) * p.hidden;
    rows[2 * i + 1] = w + static_cast<int64_t>(p.inter + n) * p.hidden;
  }
  float acc[2 * kN] = {};
  const bf16_t* x = p.x + t * p.x_stride;
  const bf16_t* xs = reinterpret_cast<const bf16_t*>(x_smem);
  // kU chunks of 8 per lane loaded before any arithmetic: 2 kN rows x kU chunks of 16 bytes in
  // flight per lane (16 at the default 2 x 4, as at 4 x 2).
  for (int c0 = lane * 8; c0 < p.hidden; c0 += kU * 32 * 8) {
    Bf16x8 xv[kU], wv[kU][2 * kN];
#pragma unroll
    for (int j = 0; j < kU; ++j) {
      const int c = c0 + j * 32 * 8;
      if (c >= p.hidden) break;
      if constexpr (!kOneWave) xv[j] = *reinterpret_cast<const Bf16x8*>(x + c);
#pragma unroll
      for (int r = 0; r < 2 * kN; ++r) wv[j][r] = LoadStreaming(rows[r] + c);
    }
#pragma unroll
    for (int j = 0; j < kU; ++j) {
      if (c0 + j * 32 * 8 >= p.hidden) break;
      float xf[8];
      if constexpr (kOneWave) Unpack8(*reinterpret_cast<const Bf16x8*>(xs + c0 + j * 32 * 8), xf);
      else Unpack8(xv[j], xf);
#pragma unroll
      for (int r = 0; r < 2 * kN; ++r) {
        float wf[8];
        Unpack8(wv[j][r], wf);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r] = fmaf(wf[i], xf[i], acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2 * kN; ++r) acc[r] = WarpSum(acc[r]);
  if (lane < kN && n0 + lane < p.inter) {
    // Lane i writes output n0 + i (the unrolled select keeps acc in registers).
    float g = acc[0], u = acc[1];
#pragma unroll
    for (int i = 1; i < kN; ++i)
      if (lane == i) g = acc[2 * i], u = acc[2 * i + 1];
    p.act[static_cast<int64_t>(pair) * p.inter + n0 + lane] = g / (1.f + expf(-g)) * u;
  }
}

__global__ void __launch_bounds__(kWarps * 32) PairDownCombineKernel(const __grid_constant__ PairGemvParams p) {
  GridDependencyWait();
  TriggerDependents();
  const int t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h0 = (blockIdx.y * kWarps + warp) * kDownRows;
  if (h0 >= p.hidden) return;
  float acc[kDownRows] = {};
  for (int slot = 0; slot < p.top_k; ++slot) {
    const int e = p.ids[t * p.ids_stride + slot];
    if (e < 0 || e >= p.experts) continue;
    const float wt = p.weights[t * p.weights_stride + slot];
    const bf16_t* w = p.w_down + static_cast<int64_t>(e) * p.hidden * p.inter;
    const float* a = p.act + static_cast<int64_t>(t * p.top_k + slot) * p.inter;
    const bf16_t* rows[kDownRows];
#pragma unroll
    for (int r = 0; r < kDownRows; ++r) rows[r] = w + static_cast<int64_t>(min(h0 + r, p.hidden - 1)) * p.inter;
    float part[kDownRows] = {};
    for (int c0 = lane * 8; c0 < p.inter; c0 += kUnroll * 32 * 8) {
      float4 av[kUnroll][2];
      Bf16x8 wv[kUnroll][kDownRows];
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int c = c0 + j * 32 * 8;
        if (c >= p.inter) break;
        av[j][0] = *reinterpret_cast<const float4*>(a + c);
        av[j][1] = *reinterpret_cast<const float4*>(a + c + 4);
#pragma unroll
        for (int r = 0; r < kDownRows; ++r) wv[j][r] = LoadStreaming(rows[r] + c);
      }
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        if (c0 + j * 32 * 8 >= p.inter) break;
        const float af[8] = {av[j][0].x, av[j][0].y, av[j][0].z, av[j][0].w,
                             av[j][1].x, av[j][1].y, av[j][1].z, av[j][1].w};
#pragma unroll
        for (int r = 0; r < kDownRows; ++r) {
          float wf[8];
          Unpack8(wv[j][r], wf);
#pragma unroll
          for (int i = 0; i < 8; ++i) part[r] = fmaf(wf[i], af[i], part[r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kDownRows; ++r) acc[r] = fmaf(wt, part[r], acc[r]);
  }
#pragma unroll
  for (int r = 0; r < kDownRows; ++r) acc[r] = WarpSum(acc[r]);
  if (lane < kDownRows && h0 + lane < p.hidden) {
    float v = acc[0];
#pragma unroll
    for (int r = 1; r < kDownRows; ++r)
      if (lane == r) v = acc[r];
    p.out[t * p.out_stride + h0 + lane] = __float2bfloat16(v);
  }
}

// The down + combine of PairDownCombineKernel with the top-k slots spread over the warps: warp w
// takes slots w, w + kSlotWarps, ... for kR rows of W_down (4, or 8 by default: Tuning().
// moe_pair_down_rows), and the warps' weighted sums meet in shared memory (in warp order:
// deterministic). Each lane keeps kR x kU loads of 16 bytes in flight (16 at 4 x 4 and at the
// default 8 x 2), and the first pass of them is issued before the dependency wait:
// W_down is a weight, and the ids and weights were written by routing, which completed before
// the gate/up kernel this one follows passed its own wait (this grid starts only once every CTA
// of that one has triggered, after its wait). So the down weights stream while gate/up finishes.
constexpr int kSlotWarps = 8;
constexpr int kSlotRows = 4;

// kR rows of W_down a CTA, kU chunks a lane in flight per row (Tuning().moe_pair_down_rows).
template <int kR = kSlotRows, int kU = kUnroll>
__global__ void __launch_bounds__(kSlotWarps * 32) PairDownSlotsKernel(const __grid_constant__ PairGemvParams p) {
  __shared__ float partial[kSlotWarps][kR];
  TimelineScope tl(p.timeline);
  const int t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h0 = blockIdx.y * kR;
  const int* ids = p.ids + t * p.ids_stride;
  auto expert_of = [&](int slot) {
    const int e = __ldcg(ids + slot);  // L2: written by an earlier kernel of this forward
    return e < 0 || e >= p.experts ? -1 : e;
  };
  auto row_ptrs = [&](int e, const bf16_t* (&rows)[kR]) {
    const bf16_t* w = p.w_down + static_cast<int64_t>(e) * p.hidden * p.inter;
#pragma unroll
    for (int r = 0; r < kR; ++r) rows[r] = w + static_cast<int64_t>(min(h0 + r, p.hidden - 1)) * p.inter;
  };
  Bf16x8 wv[kU][kR];
  auto load_pass = [&](const bf16_t* const (&rows)[kR], int c0) {
#pragma unroll
    for (int j = 0; j < kU; ++j) {
      const int c = c0 + j * 32 * 8;
      if (c >= p.inter) break;
#pragma unroll
      for (int r = 0; r < kR; ++r) wv[j][r] = LoadStreaming(rows[r] + c);
    }
  };
  int slot = warp;
  int e = slot < p.top_k ? expert_of(slot) : -1;
  const bf16_t* rows[kR];
  if (e >= 0) {
    row_ptrs(e, rows);
    load_pass(rows, lane * 8);
  }
  // The residual row this thread adds to (written, like the ids, before gate/up's wait).
  const bool adds = p.residual != nullptr && threadIdx.x < kR && h0 + threadIdx.x < p.hidden;
  bf16_t* res = adds ? p.residual + t * p.residual_stride + h0 + threadIdx.x : nullptr;
  const float res_old = adds ? __bfloat162float(__ldcg(res)) : 0.f;
  GridDependencyWait();  // act comes from the gate/up kernel
  tl.Waited();
  TriggerDependents();
  // Every gate/up CTA has left (this grid's wait), so none reads the record any more.
  if (p.record != nullptr && blockIdx.y == 0 && threadIdx.x < p.top_k) p.record[threadIdx.x] = __ldcg(ids + threadIdx.x);
  if (p.hits != nullptr && blockIdx.y == 0 && threadIdx.x < 32) {  // picks the prediction held
    // Lane a holds pick a and prediction a, all loads in flight at once (session 56: one thread's
    // 64 dependent volatile loads held this CTA ~15 us).
    const int lane = threadIdx.x, k = min(p.top_k, 16);
    const int mine = lane < k ? __ldcg(ids + lane) : -1, guess = lane < k ? __ldcg(p.predicted + lane) : -2;
    unsigned found = 0;
    for (int b = 0; b < k; ++b) found += __shfl_sync(0xffffffffu, guess, b) == mine ? 1u : 0u;
    found = __reduce_add_sync(0xffffffffu, lane < k ? min(found, 1u) : 0u);
    if (lane == 0) {
      atomicAdd(p.hits, static_cast<unsigned>(k));
      atomicAdd(p.hits + 1, found);
    }
  }
  float acc[kR] = {};
  bool preloaded = e >= 0;
  for (; slot < p.top_k; slot += kSlotWarps, e = slot < p.top_k ? expert_of(slot) : -1) {
    if (e < 0) continue;
    if (!preloaded) row_ptrs(e, rows);
    const float wt = __ldcg(p.weights + t * p.weights_stride + slot);
    const float* a = p.act + static_cast<int64_t>(t * p.top_k + slot) * p.inter;
    float part[kR] = {};
    for (int c0 = lane * 8; c0 < p.inter; c0 += kU * 32 * 8) {
      if (!preloaded) load_pass(rows, c0);
      preloaded = false;
      float4 av[kU][2];
#pragma unroll
      for (int j = 0; j < kU; ++j) {
        const int c = c0 + j * 32 * 8;
        if (c >= p.inter) break;
        av[j][0] = *reinterpret_cast<const float4*>(a + c);
        av[j][1] = *reinterpret_cast<const float4*>(a + c + 4);
      }
#pragma unroll
      for (int j = 0; j < kU; ++j) {
        if (c0 + j * 32 * 8 >= p.inter) break;
        const float af[8] = {av[j][0].x, av[j][0].y, av[j][0].z, av[j][0].w,
                             av[j][1].x, av[j][1].y, av[j][1].z, av[j][1].w};
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          float wf[8];
          Unpack8(wv[j][r], wf);
#pragma unroll
          for (int i = 0; i < 8; ++i) part[r] = fmaf(wf[i], af[i], part[r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kR; ++r) acc[r] = fmaf(wt, part[r], acc[r]);
  }
#pragma unroll
  for (int r = 0; r < kR; ++r) acc[r] = WarpSum(acc[r]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kR; ++r) partial[warp][r] = acc[r];
  }
  __syncthreads();
  if (threadIdx.x < kR && h0 + threadIdx.x < p.hidden) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kSlotWarps; ++w) v += partial[w][threadIdx.x];
    const bf16_t y = __float2bfloat16(v);
    p.out[t * p.out_stride + h0 + threadIdx.x] = y;
    if (adds) *res = __float2bfloat16(__bfloat162float(y) + res_old);
  }
}

// Tuning().moe_prefetch_previous: the record of the layer whose gate/up weights start at
// w_gate_up in the stream's table of picks (null past its kPreviousLayers x kPreviousTopK).
constexpr int kPreviousLayers = 256, kPreviousTopK = 16;
int32_t* PreviousTable(cudaStream_t s) {
  return static_cast<int32_t*>(
      StreamScratch(s, StreamScratchSlot::kMoePreviousPicks, kPreviousLayers * kPreviousTopK * sizeof(int32_t)));
}
int32_t* PreviousPicks(const void* w_gate_up, int k, cudaStream_t s) {
  static std::mutex mu;
  static std::map<const void*, int> layers;  // GUARDED_BY(mu)
  int i = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    i = layers.try_emplace(w_gate_up, static_cast<int>(layers.size())).first->second;
  }
  if (k > kPreviousTopK || i >= kPreviousLayers) return nullptr;
  int32_t* table = PreviousTable(s);
  return table != nullptr ? table + i * kPreviousTopK : nullptr;
}

}  // namespace

const int32_t* MoePreviousPicks(const void* w_gate_up, int top_k, cudaStream_t s) {
  return PreviousPicks(w_gate_up, top_k, s);
}

int32_t* MoePredictedPicks(cudaStream_t s) {
  return static_cast<int32_t*>(
      StreamScratch(s, StreamScratchSlot::kMoePredictedPicks, kMoePredictionInts * sizeof(int32_t)));
}

namespace {
std::mutex tag_mu;
std::map<cudaStream_t, int> stream_tags;  // GUARDED_BY(tag_mu): the last predicting launch's
int last_tag = 0;                         // GUARDED_BY(tag_mu)
// The tag of the prediction for the MoE being launched on s, or 0; taken, so that a layer whose
// o_proj did not predict does not prefetch an earlier layer's picks.
int TakeMoePredictionTag(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(tag_mu);
  const auto it = stream_tags.find(s);
  if (it == stream_tags.end()) return 0;
  const int tag = it->second;
  stream_tags.erase(it);
  return tag;
}

// Once, at the 240th launch with a prediction outside a capture (in a bench's eager steps: 5
// steps of 48 layers), the picks so far and how many the prediction held, on stdout.
void ReportPredictionHits(const unsigned* hits, cudaStream_t s) {
  static std::atomic<int> launches{0};
  if (hits == nullptr) return;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  COROLLA_CUDA_CHECK(cudaStreamIsCapturing(s, &capturing));
  if (capturing != cudaStreamCaptureStatusNone || launches.fetch_add(1) != 240) return;
  unsigned h[2] = {};
  COROLLA_CUDA_CHECK(cudaMemcpyAsync(h, hits, sizeof(h), cudaMemcpyDeviceToHost, s));
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(s));
  std::printf("moe predict: %u of %u picks predicted (%.1f%%) before the attention\n", h[1], h[0],
              h[0] > 0 ? 100.0 * h[1] / h[0] : 0.0);
}
}  // namespace

int NextMoePredictionTag(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(tag_mu);
  last_tag = last_tag == INT32_MAX ? 1 : last_tag + 1;
  return stream_tags[s] = last_tag;
}

void MoeExpertsPairGemv(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                        const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out,
                        CachingAllocator& alloc, cudaStream_t s, const TensorView* residual) {
  COROLLA_CHECK(residual == nullptr || Tuning().moe_pair_down_slots) << "the residual add needs the slots kernel";
  const int64_t tokens = x.dim(0);
  const int k = static_cast<int>(topk_ids.dim(1));
  const int inter = static_cast<int>(w_down.dim(2)), hidden = static_cast<int>(x.dim(1));
  if (tokens == 0) return;
  ScratchBuffer act(alloc, tokens * k * inter * sizeof(float));
  PairGemvParams p{x.ptr<bf16_t>(), tokens > 1 ? x.strides[0] : hidden, topk_ids.ptr<int32_t>(), topk_ids.strides[0],
                   topk_weights.ptr<float>(), topk_weights.strides[0], w_gate_up.ptr<bf16_t>(), w_down.ptr<bf16_t>(),
                   act.as<float>(), out.ptr<bf16_t>(), tokens > 1 ? out.strides[0] : hidden,
                   static_cast<int>(w_gate_up.dim(0)), k, hidden, inter};
  // The picks gate/up prefetches before its wait (Tuning().moe_prefetch_previous) and those the
  // qkv projection prefetched (moe_prefetch_qkv): a prediction, taken by its launch's tag (made
  // before qkv with moe_prefetch_qkv_predict, else in o_proj with moe_predict), whose hits the
  // down kernel counts; or the layer's picks of the last forward, which the down kernel records.
  if (tokens == 1 && Tuning().moe_pair_down_slots) {
    const bool qkv_prefetch = Tuning().moe_prefetch_qkv > 0 || Tuning().moe_prefetch_qkv_down > 0;
    const bool qkv_predicts = qkv_prefetch && Tuning().moe_prefetch_qkv_predict;
    const bool gate_up_prefetch = Tuning().moe_prefetch_previous > 0;
    if (qkv_prefetch && !qkv_predicts) p.record = PreviousPicks(w_gate_up.data, k, s);
    if (qkv_predicts || (gate_up_prefetch && Tuning().moe_predict)) {
      const bool predicted = TakeMoePredictionTag(s) != 0;  // (0: no prediction for this layer)
      p.predicted = predicted ? MoePredictedPicks(s) : nullptr;
      if (p.predicted != nullptr) p.hits = reinterpret_cast<unsigned*>(MoePredictedPicks(s) + kMoePredictionHits);
      ReportPredictionHits(p.hits, s);
      p.gate_up_prefetch = gate_up_prefetch;
    } else if (gate_up_prefetch) {
      p.record = PreviousPicks(w_gate_up.data, k, s);
      p.predicted = p.record;
    }
    p.prefetch_ahead = Tuning().moe_prefetch_previous >= 2;
  }
  // Outputs a warp for gate/up and W_down rows a CTA for down: the defaults (2 and 4) run
  // Qwen3-30B-A3B's batch-1 grids in two waves (768 and 512 CTAs); 4 and 8, with half the chunks
  // in flight per row, in one (384 and 256).
  const bool wide_gate_up = Tuning().moe_pair_gate_up_rows == 4, wide_down = Tuning().moe_pair_down_rows == 8;
  const int gate_up_n = wide_gate_up ? 4 : kGateUpN, down_rows = wide_down ? 8 : kSlotRows;
  const dim3 gate_up_grid(tokens * k, CeilDiv(inter, kWarps * gate_up_n));
  p.timeline = TimelineRecord("PairGateUp", int64_t{gate_up_grid.x} * gate_up_grid.y, s);
  const size_t x_bytes = static_cast<size_t>(hidden) * 2;
  if (wide_gate_up) LaunchPdl(PairGateUpKernel<4, 2>, gate_up_grid, dim3(kWarps * 32), 0, s, 1, p);
  else if (Tuning().moe_pair_gate_up_one_wave && x_bytes <= 48 * 1024)
    LaunchPdl(PairGateUpKernel<kGateUpN, kUnroll, true>, gate_up_grid, dim3(kWarps * 32), x_bytes, s, 1, p);
  else LaunchPdl(PairGateUpKernel<>, gate_up_grid, dim3(kWarps * 32), 0, s, 1, p);
  p.timeline = nullptr;
  if (residual != nullptr) {
    p.residual = residual->ptr<bf16_t>();
    p.residual_stride = tokens > 1 ? residual->strides[0] : hidden;
  }
  const dim3 down_grid(tokens, CeilDiv(hidden, down_rows));
  if (Tuning().moe_pair_down_slots && TimelineOn())
    p.timeline = TimelineRecord("PairDownSlots", int64_t{down_grid.x} * down_grid.y, s);
  if (Tuning().moe_pair_down_slots && wide_down)
    LaunchPdl(PairDownSlotsKernel<8, 2>, down_grid, dim3(kSlotWarps * 32), 0, s, 1, p);
  else if (Tuning().moe_pair_down_slots)
    LaunchPdl(PairDownSlotsKernel<>, down_grid, dim3(kSlotWarps * 32), 0, s, 1, p);
  else
    LaunchPdl(PairDownCombineKernel, dim3(tokens, CeilDiv(hidden, kWarps * kDownRows)), dim3(kWarps * 32), 0, s, 1, p);
}

// ---- FP8 (block-scaled e4m3) weights ---------------------------------------------------------
namespace {

constexpr int kFp8Chunk = 16;  // e4m3 weights per 16-byte load
constexpr int kFp8Group = 128;

// 16 e4m3 (byte i = element i) -> f32, two at a time through half2 (exact: e4m3 fits f16).
__device__ __forceinline__ void UnpackFp8x16(const uint4& v, float (&f)[kFp8Chunk]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w[i] & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w[i] >> 16), __NV_E4M3);
    const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
    f[4 * i] = a.x;
    f[4 * i + 1] = a.y;
    f[4 * i + 2] = b.x;
    f[4 * i + 3] = b.y;
  }
}

// acc + scale * (16 e4m3 weights w . x): one chunk of a weight row, scale_row[g] its 128-column
// block's scale (the weight-only FP8 GEMVs below).
__device__ __forceinline__ float Fp8ChunkFma(const uint4& w, const float (&x)[kFp8Chunk], const float* scale_row,
                                            int g, float acc) {
  float wf[kFp8Chunk];
  UnpackFp8x16(w, wf);
  float dot = 0.f;
#pragma unroll
  for (int i = 0; i < kFp8Chunk; ++i) dot = fmaf(wf[i], x[i], dot);
  return fmaf(dot, __ldg(scale_row + g), acc);
}

__device__ __forceinline__ uint4 LoadStreamingFp8(const uint8_t* p) { return __ldcs(reinterpret_cast<const uint4*>(p)); }

struct PairGemvFp8Params {
  const bf16_t* x;
  int64_t x_stride;
  const int32_t* ids;
  int64_t ids_stride;
  const float* weights;
  int64_t weights_stride;
  const uint8_t* w_gate_up;  // [E, 2I, H] e4m3
  const float* gu_scale;     // [E, 2 ceil(I/128), ceil(H/128)]
  const uint8_t* w_down;     // [E, H, I] e4m3
  const float* d_scale;      // [E, ceil(H/128), ceil(I/128)]
  float* act;                // [T * k, I]
  bf16_t* out;
  int64_t out_stride;
  int experts, top_k, hidden, inter, h_groups, i_groups;
};

__global__ void __launch_bounds__(kWarps * 32) PairGateUpFp8Kernel(const __grid_constant__ PairGemvFp8Params p) {
  GridDependencyWait();
  TriggerDependents();
  const int pair = blockIdx.x;
  const int t = pair / p.top_k, slot = pair % p.top_k;
  const int e = p.ids[t * p.ids_stride + slot];
  if (e < 0 || e >= p.experts) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = (blockIdx.y * kWarps + warp) * kGateUpN;
  if (n0 >= p.inter) return;
  const uint8_t* w = p.w_gate_up + static_cast<int64_t>(e) * 2 * p.inter * p.hidden;
  const float* sc = p.gu_scale + static_cast<int64_t>(e) * 2 * p.i_groups * p.h_groups;
  // Rows 2i: gate n0 + i, 2i + 1: up n0 + i (outputs past I repeat a valid row, dropped below);
  // srow: each row's scales over H (the up half's blocks follow the gate half's).
  const uint8_t* rows[2 * kGateUpN];
  const float* srow[2 * kGateUpN];
#pragma unroll
  for (int i = 0; i < kGateUpN; ++i) {
    const int n = min(n0 + i, p.inter - 1);
    rows[2 * i] = w + static_cast<int64_t>(n) * p.hidden;
    rows[2 * i + 1] = w + static_cast<int64_t>(p.inter + n) * p.hidden;
    srow[2 * i] = sc + static_cast<int64_t>(n / kFp8Group) * p.h_groups;
    srow[2 * i + 1] = sc + static_cast<int64_t>(p.i_groups + n / kFp8Group) * p.h_groups;
  }
  float acc[2 * kGateUpN] = {};
  const bf16_t* x = p.x + t * p.x_stride;
  for (int c0 = lane * kFp8Chunk; c0 < p.hidden; c0 += kUnroll * 32 * kFp8Chunk) {
    Bf16x8 xv[kUnroll][2];
    uint4 wv[kUnroll][2 * kGateUpN];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int c = c0 + j * 32 * kFp8Chunk;
      if (c >= p.hidden) break;
      xv[j][0] = *reinterpret_cast<const Bf16x8*>(x + c);
      xv[j][1] = *reinterpret_cast<const Bf16x8*>(x + c + 8);
#pragma unroll
      for (int r = 0; r < 2 * kGateUpN; ++r) wv[j][r] = LoadStreamingFp8(rows[r] + c);
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int c = c0 + j * 32 * kFp8Chunk;
      if (c >= p.hidden) break;
      float xf[kFp8Chunk];
      Unpack8(xv[j][0], xf);
      Unpack8(xv[j][1], xf + 8);
      const int g = c / kFp8Group;
#pragma unroll
      for (int r = 0; r < 2 * kGateUpN; ++r) acc[r] = Fp8ChunkFma(wv[j][r], xf, srow[r], g, acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < 2 * kGateUpN; ++r) acc[r] = WarpSum(acc[r]);
  if (lane < kGateUpN && n0 + lane < p.inter) {
    float g = acc[0], u = acc[1];
#pragma unroll
    for (int i = 1; i < kGateUpN; ++i)
      if (lane == i) g = acc[2 * i], u = acc[2 * i + 1];
    p.act[static_cast<int64_t>(pair) * p.inter + n0 + lane] = g / (1.f + expf(-g)) * u;
  }
}

__global__ void __launch_bounds__(kWarps * 32) PairDownCombineFp8Kernel(const __grid_constant__ PairGemvFp8Params p) {
  GridDependencyWait();
  TriggerDependents();
  const int t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h0 = (blockIdx.y * kWarps + warp) * kDownRows;
  if (h0 >= p.hidden) return;
  float acc[kDownRows] = {};
  for (int slot = 0; slot < p.top_k; ++slot) {
    const int e = p.ids[t * p.ids_stride + slot];
    if (e < 0 || e >= p.experts) continue;
    const float wt = p.weights[t * p.weights_stride + slot];
    const uint8_t* w = p.w_down + static_cast<int64_t>(e) * p.hidden * p.inter;
    const float* sc = p.d_scale + static_cast<int64_t>(e) * p.h_groups * p.i_groups;
    const float* a = p.act + static_cast<int64_t>(t * p.top_k + slot) * p.inter;
    const uint8_t* rows[kDownRows];
    const float* srow[kDownRows];
#pragma unroll
    for (int r = 0; r < kDownRows; ++r) {
      const int h = min(h0 + r, p.hidden - 1);
      rows[r] = w + static_cast<int64_t>(h) * p.inter;
      srow[r] = sc + static_cast<int64_t>(h / kFp8Group) * p.i_groups;
    }
    float part[kDownRows] = {};
    for (int c0 = lane * kFp8Chunk; c0 < p.inter; c0 += kUnroll * 32 * kFp8Chunk) {
      float4 av[kUnroll][4];
      uint4 wv[kUnroll][kDownRows];
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int c = c0 + j * 32 * kFp8Chunk;
        if (c >= p.inter) break;
#pragma unroll
        for (int q = 0; q < 4; ++q) av[j][q] = *reinterpret_cast<const float4*>(a + c + 4 * q);
#pragma unroll
        for (int r = 0; r < kDownRows; ++r) wv[j][r] = LoadStreamingFp8(rows[r] + c);
      }
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int c = c0 + j * 32 * kFp8Chunk;
        if (c >= p.inter) break;
        float af[kFp8Chunk];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          af[4 * q] = av[j][q].x;
          af[4 * q + 1] = av[j][q].y;
          af[4 * q + 2] = av[j][q].z;
          af[4 * q + 3] = av[j][q].w;
        }
        const int g = c / kFp8Group;
#pragma unroll
        for (int r = 0; r < kDownRows; ++r) part[r] = Fp8ChunkFma(wv[j][r], af, srow[r], g, part[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kDownRows; ++r) acc[r] = fmaf(wt, part[r], acc[r]);
  }
#pragma unroll
  for (int r = 0; r < kDownRows; ++r) acc[r] = WarpSum(acc[r]);
  if (lane < kDownRows && h0 + lane < p.hidden) {
    float v = acc[0];
#pragma unroll
    for (int r = 1; r < kDownRows; ++r)
      if (lane == r) v = acc[r];
    p.out[t * p.out_stride + h0 + lane] = __float2bfloat16(v);
  }
}

// PairDownSlotsKernel for e4m3 weights: warp w takes slots w, w + kSlotWarps, ... of its token
// for kSlotRows rows of W_down, the first pass of weight loads issued before the dependency
// wait (see PairDownSlotsKernel for why that is safe), the warps' sums meeting in shared memory.
__global__ void __launch_bounds__(kSlotWarps * 32) PairDownSlotsFp8Kernel(const __grid_constant__ PairGemvFp8Params p) {
  __shared__ float partial[kSlotWarps][kSlotRows];
  const int t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h0 = blockIdx.y * kSlotRows;
  const int* ids = p.ids + t * p.ids_stride;
  auto expert_of = [&](int slot) {
    const int e = __ldcg(ids + slot);
    return e < 0 || e >= p.experts ? -1 : e;
  };
  const uint8_t* rows[kSlotRows];
  const float* srow[kSlotRows];
  auto row_ptrs = [&](int e) {
    const uint8_t* w = p.w_down + static_cast<int64_t>(e) * p.hidden * p.inter;
    const float* sc = p.d_scale + static_cast<int64_t>(e) * p.h_groups * p.i_groups;
#pragma unroll
    for (int r = 0; r < kSlotRows; ++r) {
      const int h = min(h0 + r, p.hidden - 1);
      rows[r] = w + static_cast<int64_t>(h) * p.inter;
      srow[r] = sc + static_cast<int64_t>(h / kFp8Group) * p.i_groups;
    }
  };
  uint4 wv[kUnroll][kSlotRows];
  auto load_pass = [&](int c0) {
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int c = c0 + j * 32 * kFp8Chunk;
      if (c >= p.inter) break;
#pragma unroll
      for (int r = 0; r < kSlotRows; ++r) wv[j][r] = LoadStreamingFp8(rows[r] + c);
    }
  };
  int slot = warp;
  int e = slot < p.top_k ? expert_of(slot) : -1;
  if (e >= 0) {
    row_ptrs(e);
    load_pass(lane * kFp8Chunk);
  }
  GridDependencyWait();  // act comes from the gate/up kernel
  TriggerDependents();
  float acc[kSlotRows] = {};
  bool preloaded = e >= 0;
  for (; slot < p.top_k; slot += kSlotWarps, e = slot < p.top_k ? expert_of(slot) : -1) {
    if (e < 0) continue;
    if (!preloaded) row_ptrs(e);
    const float wt = __ldcg(p.weights + t * p.weights_stride + slot);
    const float* a = p.act + static_cast<int64_t>(t * p.top_k + slot) * p.inter;
    float part[kSlotRows] = {};
    for (int c0 = lane * kFp8Chunk; c0 < p.inter; c0 += kUnroll * 32 * kFp8Chunk) {
      if (!preloaded) load_pass(c0);
      preloaded = false;
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int c = c0 + j * 32 * kFp8Chunk;
        if (c >= p.inter) break;
        float af[kFp8Chunk];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float4 v = *reinterpret_cast<const float4*>(a + c + 4 * q);
          af[4 * q] = v.x;
          af[4 * q + 1] = v.y;
          af[4 * q + 2] = v.z;
          af[4 * q + 3] = v.w;
        }
        const int g = c / kFp8Group;
#pragma unroll
        for (int r = 0; r < kSlotRows; ++r) part[r] = Fp8ChunkFma(wv[j][r], af, srow[r], g, part[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kSlotRows; ++r) acc[r] = fmaf(wt, part[r], acc[r]);
  }
#pragma unroll
  for (int r = 0; r < kSlotRows; ++r) acc[r] = WarpSum(acc[r]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kSlotRows; ++r) partial[warp][r] = acc[r];
  }
  __syncthreads();
  if (threadIdx.x < kSlotRows && h0 + threadIdx.x < p.hidden) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kSlotWarps; ++w) v += partial[w][threadIdx.x];
    p.out[t * p.out_stride + h0 + threadIdx.x] = __float2bfloat16(v);
  }
}

}  // namespace

void MoeExpertsPairGemvFp8(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                           const TensorView& w_gate_up, const TensorView& gu_scale, const TensorView& w_down,
                           const TensorView& d_scale, const TensorView& out, CachingAllocator& alloc,
                           cudaStream_t s) {
  const int64_t tokens = x.dim(0);
  const int k = static_cast<int>(topk_ids.dim(1));
  const int inter = static_cast<int>(w_down.dim(2)), hidden = static_cast<int>(x.dim(1));
  if (tokens == 0) return;
  ScratchBuffer act(alloc, tokens * k * inter * sizeof(float));
  PairGemvFp8Params p{x.ptr<bf16_t>(), tokens > 1 ? x.strides[0] : hidden, topk_ids.ptr<int32_t>(),
                      topk_ids.strides[0], topk_weights.ptr<float>(), topk_weights.strides[0],
                      w_gate_up.ptr<uint8_t>(), gu_scale.ptr<float>(), w_down.ptr<uint8_t>(), d_scale.ptr<float>(),
                      act.as<float>(), out.ptr<bf16_t>(), tokens > 1 ? out.strides[0] : hidden,
                      static_cast<int>(w_gate_up.dim(0)), k, hidden, inter, CeilDiv(hidden, kFp8Group),
                      CeilDiv(inter, kFp8Group)};
  LaunchPdl(PairGateUpFp8Kernel, dim3(tokens * k, CeilDiv(inter, kWarps * kGateUpN)), dim3(kWarps * 32), 0, s, 1, p);
  if (Tuning().moe_pair_down_slots)
    LaunchPdl(PairDownSlotsFp8Kernel, dim3(tokens, CeilDiv(hidden, kSlotRows)), dim3(kSlotWarps * 32), 0, s, 1, p);
  else
    LaunchPdl(PairDownCombineFp8Kernel, dim3(tokens, CeilDiv(hidden, kWarps * kDownRows)), dim3(kWarps * 32), 0, s,
              1, p);
}

}  // namespace corolla::cuda
