// The ops between Qwen3's qkv projection and its attention in one launch (Backend::
// QkNormRopeKvWrite): per-head RMSNorm of q and k, neox rotary embedding over the whole head,
// and the paged KV write of k and v. One warp per (token, head), or per (token, 4 heads) for
// larger batches, over the q, k and v heads of the step; a head's math is NormRopeHead
// (attention_prologue.cuh, shared with the decode attention that folds this prologue in). The
// normalised values stay in f32 into the rotation (the separate ops round them to bf16 in between).
#include <type_traits>

#include "kernels/cuda/attention_prologue.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/timeline.cuh"
#include "kernels/cuda/timeline.h"

namespace corolla::cuda {
namespace {

struct PrologueParams {
  bf16_t* q;
  int64_t q_token_stride, q_head_stride;
  bf16_t* k;
  int64_t k_token_stride, k_head_stride;
  const bf16_t* v;
  int64_t v_token_stride, v_head_stride;
  const void* q_w;
  const void* k_w;
  bool q_w_f32, k_w_f32;
  float eps;
  const int32_t* positions;
  const float* inv_freq;  // [D / 2]
  float attention_factor;
  bf16_t* k_cache;  // [num_blocks, Hk, block_size, D]
  bf16_t* v_cache;
  const int32_t* slots;
  int64_t num_slots;
  int block_size;
  int64_t tokens;
  int hq, hk;
  bool early_trigger = false;    // Tuning().prologue_early_trigger
  bool early_loads = false;      // Tuning().prologue_early_loads
  uint64_t* timeline = nullptr;  // timeline.h
};

// The row of head h of token t (q heads, then k, then v).
__device__ __forceinline__ const bf16_t* HeadRow(const PrologueParams& p, int64_t t, int h) {
  if (h < p.hq) return p.q + t * p.q_token_stride + h * p.q_head_stride;
  if (h < p.hq + p.hk) return p.k + t * p.k_token_stride + (h - p.hq) * p.k_head_stride;
  return p.v + t * p.v_token_stride + (h - p.hq - p.hk) * p.v_head_stride;
}

// Head h of token t, its row `in`: a v head goes into the cache as it is; a q or k head is
// normalised and rotated (NormRopeHead) in place, a k head into the cache too. The weights are
// picked element by element: `is_q ? qw : kw` as arrays selects between two addresses, which put
// both in local memory (an H200 profile at 8192 tokens: half the stalls on those loads).
template <int kD>
__device__ __forceinline__ void WriteHead(const PrologueParams& p, int64_t t, int h, const BfVec<kD / 32>& in,
                                          const float (&qw)[kD / 32], const float (&kw)[kD / 32],
                                          const LaneRope<kD>& rope, bool to_cache, int64_t block, int64_t offset,
                                          int e0) {
  using Vec = BfVec<kD / 32>;
  auto cache_at = [&](bf16_t* cache, int kv_head) {
    return cache + ((block * p.hk + kv_head) * p.block_size + offset) * kD + e0;
  };
  if (h >= p.hq + p.hk) {  // a v head
    if (to_cache) *reinterpret_cast<Vec*>(cache_at(p.v_cache, h - p.hq - p.hk)) = in;
    return;
  }
  const bool is_q = h < p.hq;
  float w[kD / 32];
#pragma unroll
  for (int i = 0; i < kD / 32; ++i) w[i] = is_q ? qw[i] : kw[i];
  const Vec out = NormRopeHead<kD>(in, w, p.eps, rope);
  bf16_t* x = is_q ? p.q + t * p.q_token_stride + h * p.q_head_stride
                   : p.k + t * p.k_token_stride + (h - p.hq) * p.k_head_stride;
  *reinterpret_cast<Vec*>(x + e0) = out;
  if (!is_q && to_cache) *reinterpret_cast<Vec*>(cache_at(p.k_cache, h - p.hq)) = out;
}

// kHeads consecutive heads of one token per warp (the heads of a token are q, then k, then v):
// the rotary angles of the lane's elements are computed once for all of them (sincosf with its
// range reduction is most of a head's arithmetic at long positions), and the heads' loads are
// all issued before the first is used. 1 for small batches, where a warp per head spreads the
// few tokens over more SMs.
template <int kD, int kHeads>
__global__ void QkNormRopeKvWriteKernel(const __grid_constant__ PrologueParams p) {
  TimelineScope tl(p.timeline);
  if (p.early_trigger) TriggerDependents();  // safe: pdl.cuh
  constexpr int kPer = kD / 32;
  using Vec = BfVec<kPer>;
  const int heads = p.hq + 2 * p.hk, warps_per_token = (heads + kHeads - 1) / kHeads;
  const int64_t g = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const bool active = g < p.tokens * warps_per_token;  // whole warps
  const int64_t t = active ? g / warps_per_token : 0;
  const int h0 = static_cast<int>(g % warps_per_token) * kHeads, e0 = lane * kPer;
  // The slot, the rotation and the norm weights: before the dependency wait with p.early_loads.
  // Safe there: the step's metadata (positions, slots: copied from the host), inv_freq and the
  // norm weights are written by no kernel of the forward (the decode attention reads its
  // metadata before its wait on the same ground). After the wait only the step's q / k / v.
  int slot = 0;
  LaneRope<kD> rope;
  float qw[kPer], kw[kPer];
  auto setup = [&] {
    slot = p.slots[t];
    if (h0 < p.hq + p.hk)
      rope = kHeads > 1 ? MakeLaneRopeShared<kD>(static_cast<float>(p.positions[t]), p.inv_freq, p.attention_factor, lane)
                        : MakeLaneRope<kD>(static_cast<float>(p.positions[t]), p.inv_freq, p.attention_factor, lane);
    // Only the weights of the warp's heads: q heads come first, then k, then v.
    if (h0 < p.hq) LaneNormWeights<kD>(p.q_w, p.q_w_f32, lane, qw);
    if (h0 < p.hq + p.hk && h0 + kHeads > p.hq) LaneNormWeights<kD>(p.k_w, p.k_w_f32, lane, kw);
  };
  if (p.early_loads && active) setup();
  GridDependencyWait();  // launched with programmatic dependent launch (pdl.cuh)
  tl.Waited();
  if (!p.early_trigger) TriggerDependents();
  if (!active) return;
  Vec in[kHeads];
#pragma unroll
  for (int j = 0; j < kHeads; ++j)
    if (h0 + j < heads) in[j] = *reinterpret_cast<const Vec*>(HeadRow(p, t, h0 + j) + e0);
  if (!p.early_loads) setup();
  const bool to_cache = slot >= 0 && slot < p.num_slots;  // padding tokens have no slot
  const int64_t block = to_cache ? slot / p.block_size : 0, offset = to_cache ? slot % p.block_size : 0;
  // Neox pairs (i, i + D/2): lanes 0-15 hold the first halves, lanes 16-31 their partners.
#pragma unroll
  for (int j = 0; j < kHeads; ++j) {
    if (h0 + j >= heads) break;
    WriteHead<kD>(p, t, h0 + j, in[j], qw, kw, rope, to_cache, block, offset, e0);
  }
}

// Many tokens (prefill): a warp per token walks all of its heads, kGroup at a time with the next
// group's loads issued before this one's math, so that the rotation's angles (MakeLaneRopeShared),
// the slot and the norm weights are formed once a token instead of once every few heads (an H200
// profile of the kernel above at 8192 tokens: issue-bound, 70% of the schedulers' slots). Same
// math per head (NormRopeHead): the same bits. Registers capped so that 32 warps fit an SM (D
// 128: 64, no spills; D 256 at 128).
template <int kD>
__global__ void __launch_bounds__(128, kD <= 128 ? 8 : 4) QkNormRopeKvWriteTokenKernel(const __grid_constant__ PrologueParams p) {
  constexpr int kGroup = 4;
  TimelineScope tl(p.timeline);
  if (p.early_trigger) TriggerDependents();  // safe: pdl.cuh
  constexpr int kPer = kD / 32;
  using Vec = BfVec<kPer>;
  const int heads = p.hq + 2 * p.hk;
  const int64_t t = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32, e0 = lane * kPer;
  const bool active = t < p.tokens;  // whole warps
  int slot = 0;
  LaneRope<kD> rope;
  float qw[kPer], kw[kPer];
  auto setup = [&] {  // (as the kernel above: safe before the wait)
    slot = p.slots[t];
    rope = MakeLaneRopeShared<kD>(static_cast<float>(p.positions[t]), p.inv_freq, p.attention_factor, lane);
    LaneNormWeights<kD>(p.q_w, p.q_w_f32, lane, qw);
    LaneNormWeights<kD>(p.k_w, p.k_w_f32, lane, kw);
  };
  if (p.early_loads && active) setup();
  GridDependencyWait();  // launched with programmatic dependent launch (pdl.cuh)
  tl.Waited();
  if (!p.early_trigger) TriggerDependents();
  if (!active) return;
  auto load_group = [&](int h0, Vec (&in)[kGroup]) {
#pragma unroll
    for (int j = 0; j < kGroup; ++j)
      if (h0 + j < heads) in[j] = *reinterpret_cast<const Vec*>(HeadRow(p, t, h0 + j) + e0);
  };
  Vec cur[kGroup], next[kGroup];
  load_group(0, cur);
  if (!p.early_loads) setup();
  const bool to_cache = slot >= 0 && slot < p.num_slots;  // padding tokens have no slot
  const int64_t block = to_cache ? slot / p.block_size : 0, offset = to_cache ? slot % p.block_size : 0;
  for (int h0 = 0; h0 < heads; h0 += kGroup) {
    if (h0 + kGroup < heads) load_group(h0 + kGroup, next);
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      if (h0 + j >= heads) break;
      WriteHead<kD>(p, t, h0 + j, cur[j], qw, kw, rope, to_cache, block, offset, e0);
    }
#pragma unroll
    for (int j = 0; j < kGroup; ++j) cur[j] = next[j];
  }
}

bool Aligned(const void* ptr, int64_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

}  // namespace

bool QkNormRopeKvWriteServes(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& q_norm_w,
                             const TensorView& k_norm_w, const TensorView& positions, const RopeParams& rope,
                             const KvCacheView& cache, const AttentionBatch& batch) {
  const int64_t d = q.dim(2), tokens = q.dim(0);
  // Covered: Qwen3's layout (whole-head neox rotary, separate K/V caches of the head dim).
  const bool shape_ok =
      q.rank() == 3 && k.rank() == 3 && v.rank() == 3 && k.dim(2) == d && v.dim(2) == d && k.dim(0) == tokens &&
      v.dim(0) == tokens && v.dim(1) == k.dim(1) && q.dtype == DType::kBF16 && k.dtype == DType::kBF16 &&
      v.dtype == DType::kBF16 && cache.k.dtype == DType::kBF16 && cache.v.dtype == DType::kBF16 &&
      cache.k.data != cache.v.data && cache.k.rank() == 4 && cache.k.dim(3) == d && cache.v.dim(3) == d &&
      cache.k.dim(1) == k.dim(1) && cache.k.is_contiguous() && cache.v.is_contiguous() &&
      rope.rotary_dim == d && !rope.interleaved && (d == 64 || d == 128 || d == 256) && q.strides[2] == 1 &&
      (q_norm_w.dtype == DType::kF32 || q_norm_w.dtype == DType::kBF16) &&
      (k_norm_w.dtype == DType::kF32 || k_norm_w.dtype == DType::kBF16) &&
      k.strides[2] == 1 && v.strides[2] == 1 && q_norm_w.numel() == d && k_norm_w.numel() == d &&
      batch.slot_mapping.numel() == tokens && positions.numel() == tokens;
  if (!shape_ok) return false;
  const int64_t per = d / 32;  // elements per lane: vector accesses of 2 * per bytes
  for (const TensorView* t : {&q, &k, &v})
    if (!Aligned(t->data, 2 * per) || t->strides[0] % per != 0 || t->strides[1] % per != 0) return false;
  return true;
}

bool QkNormRopeKvWrite(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& q_norm_w,
                       const TensorView& k_norm_w, float eps, const TensorView& positions, const RopeParams& rope,
                       const float* inv_freq, const KvCacheView& cache, const AttentionBatch& batch, cudaStream_t s) {
  if (!QkNormRopeKvWriteServes(q, k, v, q_norm_w, k_norm_w, positions, rope, cache, batch)) return false;
  const int64_t d = q.dim(2), tokens = q.dim(0);
  if (tokens == 0) return true;
  PrologueParams p{q.ptr<bf16_t>(), q.strides[0], q.strides[1], k.ptr<bf16_t>(), k.strides[0], k.strides[1],
                   v.ptr<bf16_t>(), v.strides[0], v.strides[1], q_norm_w.data, k_norm_w.data,
                   q_norm_w.dtype == DType::kF32, k_norm_w.dtype == DType::kF32, eps, positions.ptr<int32_t>(),
                   inv_freq, rope.attention_factor, cache.k.ptr<bf16_t>(), cache.v.ptr<bf16_t>(),
                   batch.slot_mapping.ptr<int32_t>(), cache.k.dim(0) * cache.block_size(), cache.block_size(),
                   tokens, static_cast<int>(q.dim(1)), static_cast<int>(k.dim(1))};
  // A warp per head below kManyTokens tokens (the few tokens spread over more SMs); from there
  // kHeadsPerWarp heads a warp (on an H200, Qwen3-30B-A3B, 8192 tokens: 110.9 us a layer
  // against 122.2 with 8 heads a warp and slower again with 2), and a warp per token
  // (QkNormRopeKvWriteTokenKernel) from Tuning().prologue_warp_per_token_min_tokens.
  constexpr int64_t kManyTokens = 64;
  constexpr int kHeadsPerWarp = 4;
  const int64_t heads = q.dim(1) + 2 * k.dim(1);
  const bool many = tokens >= kManyTokens;
  const bool per_token = many && Tuning().prologue_warp_per_token &&
                         tokens >= Tuning().prologue_warp_per_token_min_tokens;
  const int64_t warps = per_token ? tokens : tokens * (many ? CeilDiv(heads, kHeadsPerWarp) : heads);
  const dim3 grid(CeilDiv(warps * 32, 128));
  p.early_trigger = Tuning().prologue_early_trigger;
  p.early_loads = Tuning().prologue_early_loads;
  p.timeline = TimelineRecord(per_token ? "QkNormRopeKvWrite per token" : "QkNormRopeKvWrite", grid.x, s);
  auto launch = [&](auto d_tag) {
    constexpr int kD = decltype(d_tag)::value;
    if (per_token) LaunchPdl(QkNormRopeKvWriteTokenKernel<kD>, grid, dim3(128), 0, s, 1, p);
    else if (many) LaunchPdl(QkNormRopeKvWriteKernel<kD, kHeadsPerWarp>, grid, dim3(128), 0, s, 1, p);
    else LaunchPdl(QkNormRopeKvWriteKernel<kD, 1>, grid, dim3(128), 0, s, 1, p);
  };
  if (d == 64) launch(std::integral_constant<int, 64>{});
  else if (d == 128) launch(std::integral_constant<int, 128>{});
  else launch(std::integral_constant<int, 256>{});
  return true;
}

}  // namespace corolla::cuda
