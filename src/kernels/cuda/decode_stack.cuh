// The persistent decode kernel's shared definitions (decode_stack.cu): sizes, shared-memory
// layout, kernel parameters, the weight rings and the cross-CTA synchronisation. Device code;
// included by decode_stack.cu only (hence the anonymous namespace: one translation unit).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/split_kv_merge.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

using wgmma::BulkCopy;
using wgmma::EvictFirst;
using wgmma::MbarArrive;
using wgmma::MbarArriveExpectTx;
using wgmma::MbarInit;
using wgmma::MbarInitFence;
using wgmma::MbarWait;
using wgmma::SmemAddr;

constexpr int kConsumerWarps = 8;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kThreads = kConsumers + 64;  // + producer A (warp 8) + producer B (warp 9)
constexpr int kStageBytes = 16 * 1024;
constexpr int kStages = 12;    // ring A takes StackParams::stages_a of them, ring B the rest
constexpr int kD = 128;        // head dim
constexpr int kMaxGroup = 16;  // query heads per KV head
constexpr int kChunkKeys = kStageBytes / (4 * kD);  // keys per ring-A stage: K rows at 0, V at half
static_assert(kChunkKeys == 32, "the softmax keeps one key a lane");
constexpr int kTraceEvents = 30;  // COROLLA_DECODE_STACK_TRACE: events per (layer, CTA)
// Events from kTraceWaitEvents on are durations (ns + 1), not timestamps.
constexpr int kTraceWaitEvents = 28;
constexpr int kMaxVec = 8192;     // bf16 elements of the GEMV input (H and Hq * D)
constexpr int kMaxAct = 6144;     // top_k * I (f32)
constexpr int kMaxExperts = 512;
constexpr int kMaxRows = 64;         // rows of H a CTA owns (H / grid)
constexpr int kMaxDownSlots = 16;    // top_k (DOWN keeps a partial per (slot, row))
constexpr int kPartStride = kD + 4;  // attention partial: o[D], m, l (rows 16-byte aligned)

// Sync words (each on its own 128-byte line): grid barrier, merged heads, exits, per-KV-head
// split counters from kSyncHead, per-KV-head qkv-row counters from kSyncQkvHead.
constexpr int kSyncGrid = 0, kSyncMerged = 32, kSyncExit = 64, kSyncHead = 96;
constexpr int kMaxKvHeads = 64;
constexpr int kSyncQkvHead = kSyncHead + kMaxKvHeads * 32;
constexpr int kSyncWords = kSyncQkvHead + kMaxKvHeads * 32;

// Phase-local buffers share one region: the GEMV input (QKV, O, ROUTER, GATEUP), the attention
// task's q and new K/V (ATTN), and the SiLU-mul activations (DOWN) are never live together.
struct SmemLayout {
  static constexpr int kRing = 0;
  static constexpr int kShared = kRing + kStages * kStageBytes;  // vec | q, new K/V | act
  static constexpr int kVec = kShared;                           // bf16 [kMaxVec]
  static constexpr int kQ = kShared;                             // bf16 [kMaxGroup][kD]
  static constexpr int kNewKv = kQ + kMaxGroup * kD * 2;         // bf16 [2][kD]: the new K, V
  static constexpr int kAct = kShared;                           // f32 [kMaxAct]
  static constexpr int kSharedBytes = kMaxAct * 4;
  static constexpr int kDownPart = kShared + kSharedBytes;  // f32 [kMaxDownSlots][kMaxRows]
  static constexpr int kRouteScratch =
      kDownPart + kMaxDownSlots * kMaxRows * 4;  // f32 [kMaxExperts] (B)
  static constexpr int kRoute =
      kRouteScratch + kMaxExperts * 4;  // [2 layers][ids kMaxTopK | w kMaxTopK]
  static constexpr int kMisc = kRoute + 2 * 2 * kMaxTopK * 4;  // f32 / int scratch [64]
  static constexpr int kBars = kMisc + 64 * 4;                 // full[kStages], empty[kStages]
  static constexpr int kBytes = kBars + 2 * kStages * 8;
};
static_assert(kMaxVec * 2 <= SmemLayout::kSharedBytes &&
                  (kMaxGroup + 1) * kD * 2 <= SmemLayout::kSharedBytes,
              "the phase-local region holds each phase's buffers");
static_assert(SmemLayout::kBytes <= 227 * 1024, "decode stack shared memory");
static_assert(SmemLayout::kBars % 8 == 0, "mbarrier alignment");

struct StackLayer {
  const bf16_t* qkv;      // [(Hq + 2 Hk) D, H]
  const bf16_t* o;        // [H, Hq D]
  const bf16_t* router;   // [E, H]
  const bf16_t* gate_up;  // [E, 2I, H]
  const bf16_t* down;     // [E, H, I]
  const void* input_norm;
  const void* post_norm;
  const void* q_norm;
  const void* k_norm;
  bf16_t* k_cache;  // [blocks, Hk, block_size, D]
  bf16_t* v_cache;
};

struct StackParams {
  int layers, hidden, hq, hk, experts, top_k, inter;
  bool norm_f32;  // every RMSNorm weight f32 (else bf16)
  bool renormalize;
  float eps, scale_log2;  // softmax scale * log2(e)
  const float* inv_freq;  // [D / 2]
  float attention_factor;
  const int32_t* seq_lens;      // [1]
  const int32_t* block_table;   // [max_blocks]
  const int32_t* slot_mapping;  // [1]
  const int32_t* positions;     // [1]
  int block_size;
  int64_t num_slots;
  int min_split_keys;
  int stages_a;               // ring A's stages (ring B: kStages - stages_a)
  // Attention tasks wait only for the CTAs that wrote their KV head's q, k and v rows (each
  // counts once a layer on the head's kSyncQkvHead word: qkv_head_arrivals[g] of them), not for
  // a grid barrier after the qkv rows (Tuning().decode_stack_head_wait).
  bool head_wait;
  // Ring A holds the qkv rows (as many as fit) and the o rows; ring B carries the rest of the
  // qkv rows, the keys and the router rows ahead of the experts (Tuning().decode_stack_resident).
  bool resident;
  int qkv_head_arrivals[kMaxKvHeads];
  unsigned long long* trace;  // [layers][grid][kTraceEvents] %globaltimer, or null
  float* route_logits;        // DecodeStackRouteSink: [layers][E] router logits (CTA 0), or null
  int32_t* route_ids;         // [layers][top_k]
  bf16_t* sum;                // [H], the residual stream, in place
  bf16_t* x_out;              // [H], rmsnorm(sum) * final_norm after the last layer
  const void* final_norm;
  bf16_t* qkv_out;   // [(Hq + 2 Hk) D]
  float* attn_part;  // [grid][kMaxGroup][kPartStride]
  bf16_t* attn_out;  // [Hq D]
  float* logits;     // [E]
  float* act;        // [top_k I]
  unsigned* sync;
  StackLayer layer[kMaxStackLayers];
};

// ---- small helpers ---------------------------------------------------------------------
// SpinUntil and ArriveRelease: wgmma.cuh (shared with the decode attention's folded o_proj).
using wgmma::ArriveRelease;
using wgmma::SpinUntil;
// atomicAdd(p, 1) with acquire and release semantics at GPU scope: returns the old value.
__device__ __forceinline__ unsigned FetchAddAcqRel(unsigned* p) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(p) : "memory");
  return old;
}
__device__ __forceinline__ void ConsumerSync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory");
}
__device__ __forceinline__ float NormWeight(const void* w, bool f32, int i) {
  return f32 ? static_cast<const float*>(w)[i] : __bfloat162float(static_cast<const bf16_t*>(w)[i]);
}
__device__ __forceinline__ Bf16x8 LoadCg8(const bf16_t* p) {
  uint4 u = __ldcg(reinterpret_cast<const uint4*>(p));
  Bf16x8 v;
  memcpy(&v, &u, sizeof(v));
  return v;
}
// Eight bf16 of shared memory (16-byte aligned), or eight floats, as floats.
__device__ __forceinline__ void Load8(const bf16_t* p, float f[8]) { LoadShared8(p, f); }
__device__ __forceinline__ void Load8(const float* p, float f[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
struct Range {
  int begin, end;
};
// CTA c's share of n items over `parts` CTAs (the host counts the qkv shares' heads with it).
__device__ __host__ inline Range Share(int n, int c, int parts) {
  return {static_cast<int>(static_cast<int64_t>(n) * c / parts),
          static_cast<int>(static_cast<int64_t>(n) * (c + 1) / parts)};
}
// COROLLA_DECODE_STACK_TRACE: event `event` of (layer, this CTA) happens now (one thread).
// Events 16, 17, 28 and 29 write their slots inline: a TraceSet helper for them (the same stores
// through one function) made the kernel's routing 3.8 -> 11.2 us and its layer 69.2 -> 76.9 us on
// an H200 (session 32; ptxas reported the same registers and stack), so they stay as they are.
__device__ __forceinline__ void TraceNow(unsigned long long* trace, int layer, int event) {
  if (trace != nullptr)
    trace[(static_cast<int64_t>(layer) * gridDim.x + blockIdx.x) * kTraceEvents + event] =
        wgmma::GlobalTimerNs();
}
__device__ __forceinline__ int RowsPerStage(int k) { return min(kMaxRows, kStageBytes / (2 * k)); }

// Whether qkv rows [begin, end) ([q heads | k heads | v heads] x kD) hold any of KV head g's.
__device__ __host__ inline bool QkvRowsTouchHead(int begin, int end, int hq, int hk, int g) {
  const int group = hq / hk;
  auto meets = [&](int lo, int n) { return begin < lo + n && lo < end; };
  return meets(g * group * kD, group * kD) || meets((hq + g) * kD, kD) ||
         meets((hq + hk + g) * kD, kD);
}

// The attention split plan of this step, the same in every thread: S splits of the seq_len - 1
// cached keys (the new key goes with the last split).
struct SplitPlan {
  int splits, cached;
  // Split s's cached keys (SplitKeyRange, split_keys.h: none empty while cached >= splits).
  __device__ KeyRange Keys(int s) const { return SplitKeyRange(cached, splits, s, 1, cached); }
};
__device__ __forceinline__ SplitPlan PlanSplits(const StackParams& p) {
  const int cached = p.seq_lens[0] - 1;
  const int cap = max(1, min(static_cast<int>(gridDim.x) / p.hk, static_cast<int>(gridDim.x)));
  const int want = max(1, (cached + p.min_split_keys - 1) / p.min_split_keys);
  return {min(want, cap), cached};
}

// Consumer warps that share each stage of a ring of `stages` (GEMV stages belong to warps by
// ring slot): one from 8 stages on (slot s to warp s % 8), else 8 / stages where that divides
// (slot s to warps s, s + stages, ...: two a stage for a ring of 4), else one (warps past the
// last slot idle). The stage's empty barrier counts this many arrivals.
__device__ __host__ constexpr int StageSharers(int stages) {
  return stages >= kConsumerWarps || kConsumerWarps % stages != 0 ? 1 : kConsumerWarps / stages;
}

// Waits (mbarrier phase parity; SpinUntil for a global counter) with the polling loop out of
// line: inlined at each of the kernel's ~20 wait sites it grew the code past what an SM's
// instruction caches hold.
__device__ __noinline__ void StackWaitSlow(uint32_t bar, uint32_t parity) { MbarWait(bar, parity); }
__device__ __forceinline__ void StackWait(uint32_t bar, uint32_t parity) {
  if (!wgmma::MbarTryWait(bar, parity)) StackWaitSlow(bar, parity);
}
__device__ __noinline__ void StackSpin(const unsigned* p, unsigned target) { SpinUntil(p, target); }

// A ring of stages: the producer's and each consumer's position in it. The position advances
// with Next() (slot and phase kept as counters): a division by the runtime ring size at every
// stage cost each warp a ~100-instruction chain (notes/decode_step.md, "Session 31").
static_assert(kConsumerWarps == 8, "Ring::owner_shift is log2 of a divisor of 8");
struct Ring {
  uint32_t base;  // shared address of stage 0
  uint32_t full;  // shared address of full barrier 0 (8 bytes apart)
  uint32_t empty;
  int stages;
  int sharers = StageSharers(stages);
  // kConsumerWarps / sharers warps own the ring's slots, a power of two: slot s belongs to the
  // warps w with w % owners == s % owners (mask), part w / owners (shift) of the stage.
  int owner_mask = kConsumerWarps / sharers - 1;
  int owner_shift = owner_mask == 7 ? 3 : owner_mask == 3 ? 2 : owner_mask;  // log2(owners)
  uint32_t iter = 0, slot = 0, phase = 0;
  __device__ int Sharers() const { return sharers; }
  __device__ void Next() {
    ++iter;
    if (++slot == static_cast<uint32_t>(stages)) slot = 0, phase ^= 1;
  }
  __device__ uint32_t Stage() const { return base + slot * kStageBytes; }
  __device__ uint32_t Full() const { return full + slot * 8; }
  __device__ uint32_t Empty() const { return empty + slot * 8; }
  // Producer (one lane): waits until the stage is free, then expects `bytes` on its full barrier.
  __device__ void Acquire(uint32_t bytes) const {
    if (iter >= static_cast<uint32_t>(stages)) StackWait(Empty(), phase ^ 1);
    MbarArriveExpectTx(Full(), bytes);
  }
  __device__ void WaitFull() const { StackWait(Full(), phase); }
  // Each consumer warp that read the stage (one of Sharers()): done with it.
  __device__ void Release(int lane) const {
    __syncwarp();
    if (lane == 0) MbarArrive(Empty());
  }
};

}  // namespace
}  // namespace corolla::cuda
