// The tile layout, kernel parameters and K/V producers of the wgmma prefill attention kernel
// (attention_wgmma.cu, the only includer: everything here has internal linkage there). The
// producer warpgroup fills the consumers' K/V ring one of three ways: Produce (128 threads
// gather rows through the block table by cp.async, signal a tile kLag tiles later),
// ProduceSplit (the same with K and V on their own barriers, for the overlap builds) and
// ProduceTma (one warp issues TMA boxes per cache block, completion by transaction count; the
// CTA's last partial tile still gathered with the cp.async zero fill). attention_wgmma.cu's
// header comment describes the layout and the barrier protocol.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

constexpr int kDv = 128;      // V rows and O: 128 dims (two 64-dim panels)
constexpr int kBlockM = 128;  // query rows per CTA
constexpr int kBlockN = 128;  // keys per K/V tile
constexpr int kConsumers = 2;
constexpr int kWgmmaVariants = kAttentionWgmmaVariants;  // ops.h: 0..5 (AttentionWgmmaKernel)
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kProducerThreads = 128;
constexpr uint32_t kHalfK = kBlockN * 128;  // bytes of one 64-dim panel of a K or V tile
constexpr uint32_t kVTileBytes = kBlockN * kDv * 2;
// The overlap variants (>= 2) with kOverlapSplitKv: separate full / empty barriers for the K and
// the V half of each stage (fullV, emptyV after full, empty).
constexpr bool kOverlapSplitKv = true;
// O += P V with one m64n128k16 per 16 keys (true; reads the descriptor's LBO: the V half 64
// dims on) or two m64n64k16 (false; one swizzle atom wide each, no LBO). The tile probe checks
// both.
constexpr bool kPvWide = true;
// Registers per thread after the split (launch: 65536 / 384 = 168): the producer needs few, the
// consumers hold S (64 f32), O (64 f32) and P (32 bf16x2) at once.
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= 65536, "register file");
// The overlapped consumers (variants >= 2) hold S, O and P at once plus P V in flight.
constexpr int kOverlapProducerRegs = 24, kOverlapConsumerRegs = 240;
static_assert(128 * (kOverlapProducerRegs + kConsumers * kOverlapConsumerRegs) <= 65536,
              "register file");
static_assert(kDv == 128 && kBlockN == 128, "fragment indexing below assumes 128 x 128 tiles");
static_assert(kBlockN % 8 == 0 && kProducerThreads == 128,
              "producer: 16 chunks x 8 key rows per pass");

// The sizes that follow from Q's and K's head dim Dk (128, or DeepSeek's decompressed 192; V and
// O stay 128): a [rows][Dk] tile is Dk / 64 panels of [rows][64].
template <int kDk_>
struct WgmmaShape {
  static constexpr int kDk = kDk_;
  // K/V ring depth: 225 KB of shared memory with Q at Dk 128, 209 KB at 192 (of the 227 an sm_90
  // CTA may have).
  static constexpr int kStages = kDk == 128 ? 3 : 2;
  // Producer: tiles between issuing a tile's copies and signalling them.
  static constexpr int kLag = kStages >= 3 ? 1 : 0;
  static constexpr uint32_t kQBytes = kBlockM * kDk * 2;
  static constexpr uint32_t kKTileBytes = kBlockN * kDk * 2;
  static constexpr uint32_t kStageBytes = kKTileBytes + kVTileBytes;  // K then V
  static constexpr size_t kSmemBytes =
      1024 + kQBytes + kStages * kStageBytes + 2 * kStages * sizeof(uint64_t);
  static constexpr size_t kSmemBytesSplit = kSmemBytes + 2 * kStages * sizeof(uint64_t);
  static_assert(kDk % 64 == 0 && kDk >= 128 && kDk <= 192, "Dk: 128 or 192");
  static_assert(kSmemBytesSplit <= 227 * 1024, "sm_90 shared memory per CTA");
  // Consumers at tile j need full[j], signalled once the producer has issued j + kLag, which
  // needs empty[j + kLag - kStages]: released by the consumers after tile j + kLag - kStages < j.
  static_assert(kLag >= 0 && kLag <= kStages - 2, "deadlock-free lag of the full signal");
  static_assert(kQBytes % 1024 == 0 && kStageBytes % 1024 == 0 && kKTileBytes % 1024 == 0 &&
                    kHalfK % 1024 == 0,
                "1024-aligned tiles");
};

struct WgmmaAttnParams {
  // TMA producer only: the caches as [num_blocks * Hk * block_size, Dk or Dv] bf16, box 64 dims x
  // tma_box_rows keys, 128-byte swizzle.
  CUtensorMap k_map, v_map;
  const bf16_t* q;
  int64_t q_token_stride, q_head_stride;
  bf16_t* out;
  int64_t out_token_stride, out_head_stride;
  const bf16_t* k_cache;  // [num_blocks, Hk, block_size, Dk]
  // v_cache: [num_blocks, Hk, block_size, kDv]
  const bf16_t* v_cache;
  const int32_t* block_tables;  // [B, table_stride]
  int64_t table_stride;
  const int32_t* query_start;  // [B + 1]
  const int32_t* seq_lens;     // [B]
  int kv_heads, group, block_size;
  int block_shift;   // log2(block_size) when a power of two, else -1
  float scale_log2;  // softmax scale * log2(e)
  int row_tiles;
  int tma_box_rows;  // min(block_size, kBlockN), TMA producer only
  int heads_fastest;  // variants >= 1: grid x is (row tile, KV head) KV heads fastest, else rows
};

__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Byte offset of 16-byte chunk c (of Dk / 8) of row r in a [rows][Dk] bf16 tile (Dk / 64 panels).
__device__ __forceinline__ uint32_t TileChunk(int rows, int r, int c) {
  return static_cast<uint32_t>((c / 8) * rows * 128) + wgmma::Sw128(r, c % 8);
}

// O (+)= P V for one 16-key step: P's A fragment, V's 16 key rows at byte `v_rows` of the stage
// (2048 per step, inside both halves).
__device__ __forceinline__ void PvStep(float (&o)[64], const uint32_t (&a)[4], uint32_t v_rows) {
  if constexpr (kPvWide) {
    wgmma::MmaM64N128K16RsMn(o, a, wgmma::SmemDescSw128Mn(v_rows, kHalfK), true);
  } else {
    wgmma::MmaM64N64K16RsMn(*reinterpret_cast<float(*)[32]>(&o[0]), a,
                            wgmma::SmemDescSw128Mn(v_rows, 0), true);
    wgmma::MmaM64N64K16RsMn(*reinterpret_cast<float(*)[32]>(&o[32]), a,
                            wgmma::SmemDescSw128Mn(v_rows + kHalfK, 0), true);
  }
}

// The producer warpgroup's thread t copies its 16-byte chunks (kChunks a row: chunk idx % kChunks
// of key row idx / kChunks, idx = t + 128 i) of the kBlockN key rows n0.. of one cache into the
// swizzled tile at `tile` by cp.async, keys at or past kv_end zero-filled. kUnroll: the loop's
// unroll (the overlap builds' producer has 24 registers).
template <int kChunks, int kUnroll>
__device__ __forceinline__ void GatherRows(const WgmmaAttnParams& p, const int32_t* table, int kvh,
                                           int n0, int kv_end, const bf16_t* cache, uint32_t tile,
                                           int t) {
  static_assert(kBlockN * kChunks % kProducerThreads == 0, "whole passes");
#pragma unroll kUnroll
  for (int i = 0; i < kBlockN * kChunks / kProducerThreads; ++i) {
    const int idx = t + i * kProducerThreads, j = idx / kChunks, c = idx % kChunks;
    const int key = n0 + j;
    const bool valid = key < kv_end;
    int64_t offset = 0;
    if (valid) {
      const PagedSlot slot = LocateKey(table, key, p.block_size, p.block_shift);
      offset =
          ((slot.block * p.kv_heads + kvh) * p.block_size + slot.in_block) * (kChunks * 8) + c * 8;
    }
    wgmma::CpAsync16(tile + TileChunk(kBlockN, j, c), cache + offset, valid);
  }
}

// The K and V tiles of keys n0.. into stage `sk` (K, then V at kKTileBytes) by the producer
// warpgroup's thread t. Dk == Dv: one pass copies a chunk of K and of V from one offset (thread
// t: chunk t % 16 of rows t / 16 + 8 i); else a GatherRows pass each.
template <class S, int kUnroll>
__device__ __forceinline__ void GatherTile(const WgmmaAttnParams& p, const int32_t* table, int kvh,
                                           int n0, int kv_end, uint32_t sk, int t) {
  if constexpr (S::kDk == kDv) {
    const int c = t % 16, r0 = t / 16;
#pragma unroll kUnroll
    for (int i = 0; i < kBlockN / 8; ++i) {
      const int j = r0 + 8 * i, key = n0 + j;
      const bool valid = key < kv_end;
      int64_t offset = 0;
      if (valid) {
        const PagedSlot slot = LocateKey(table, key, p.block_size, p.block_shift);
        offset = ((slot.block * p.kv_heads + kvh) * p.block_size + slot.in_block) * kDv + c * 8;
      }
      const uint32_t dst = TileChunk(kBlockN, j, c);
      wgmma::CpAsync16(sk + dst, p.k_cache + offset, valid);
      wgmma::CpAsync16(sk + S::kKTileBytes + dst, p.v_cache + offset, valid);
    }
  } else {
    GatherRows<S::kDk / 8, kUnroll>(p, table, kvh, n0, kv_end, p.k_cache, sk, t);
    GatherRows<kDv / 8, kUnroll>(p, table, kvh, n0, kv_end, p.v_cache, sk + S::kKTileBytes, t);
  }
}

template <class S, int kLagT>
__device__ __forceinline__ void Produce(const WgmmaAttnParams& p, int b, int kvh, int kv_end,
                                        int num_tiles, uint32_t pipe, uint32_t full,
                                        uint32_t empty) {
  const int t = threadIdx.x - kConsumers * 128;
  const int32_t* table = p.block_tables + b * p.table_stride;
  for (int it = 0; it < num_tiles; ++it) {
    const int stage = it % S::kStages;
    if (it >= S::kStages) wgmma::MbarWait(empty + 8 * stage, ((it / S::kStages) - 1) & 1);
    GatherTile<S, 4>(p, table, kvh, it * kBlockN, kv_end, pipe + stage * S::kStageBytes, t);
    wgmma::CpAsyncCommit();
    if (it >= kLagT) {  // tile it - kLag's copies have landed: fence them to the async proxy (the
                        // consumers' wgmma reads) and signal them
      wgmma::CpAsyncWait<kLagT>();
      wgmma::FenceProxyAsync();
      wgmma::MbarArrive(full + 8 * ((it - kLagT) % S::kStages));
    }
  }
  wgmma::CpAsyncWait<0>();
  wgmma::FenceProxyAsync();
  for (int it = max(0, num_tiles - kLagT); it < num_tiles; ++it)
    wgmma::MbarArrive(full + 8 * (it % S::kStages));
}

// The producer of the overlap variants with kOverlapSplitKv: K and V of a tile are separate
// cp.async groups with their own barriers, issued K_0, V_0, K_1, V_1, ..., each as soon as its
// half of the stage is free (the consumers free K_t once S_t is done, a tile before V_t), and
// signalled one tile later (after the next group of its kind is issued: wait_group 2).
// Deadlock-free at 2 or more stages: K_t is signalled after V_t and K_{t+1} are issued, which
// need emptyV[t-2] and emptyK[t-1] (at 2 stages), both freed by the consumers at tile t-1 (< t,
// where they wait for K_t); V_{t-1} is signalled after V_t is issued, which needs emptyV[t-2],
// freed at tile t-1.
template <class S>
__device__ __forceinline__ void ProduceSplit(const WgmmaAttnParams& p, int b, int kvh, int kv_end,
                                             int num_tiles, uint32_t pipe, uint32_t full,
                                             uint32_t empty, uint32_t full_v, uint32_t empty_v) {
  const int t = threadIdx.x - kConsumers * 128;
  const int32_t* table = p.block_tables + b * p.table_stride;
  for (int it = 0; it < num_tiles; ++it) {
    const int stage = it % S::kStages;
    const uint32_t parity = ((it / S::kStages) - 1) & 1;
    const uint32_t base = pipe + stage * S::kStageBytes;
    // K: Dk / 8 chunks a row.
    if (it >= S::kStages) wgmma::MbarWait(empty + 8 * stage, parity);
    GatherRows<S::kDk / 8, 4>(p, table, kvh, it * kBlockN, kv_end, p.k_cache, base, t);
    wgmma::CpAsyncCommit();
    if (it >= 1) {  // K of tile it - 1 has landed (2 groups issued since)
      wgmma::CpAsyncWait<2>();
      wgmma::FenceProxyAsync();
      wgmma::MbarArrive(full + 8 * ((it - 1) % S::kStages));
    }
    // V: 16 chunks a row.
    if (it >= S::kStages) wgmma::MbarWait(empty_v + 8 * stage, parity);
    GatherRows<kDv / 8, 4>(p, table, kvh, it * kBlockN, kv_end, p.v_cache, base + S::kKTileBytes,
                           t);
    wgmma::CpAsyncCommit();
    if (it >= 1) {  // V of tile it - 1
      wgmma::CpAsyncWait<2>();
      wgmma::FenceProxyAsync();
      wgmma::MbarArrive(full_v + 8 * ((it - 1) % S::kStages));
    }
  }
  wgmma::CpAsyncWait<0>();
  wgmma::FenceProxyAsync();
  wgmma::MbarArrive(full + 8 * ((num_tiles - 1) % S::kStages));
  wgmma::MbarArrive(full_v + 8 * ((num_tiles - 1) % S::kStages));
}

// ---- TMA producer (kTma) ---------------------------------------------------------------------
// Named barrier 3 (0 is __syncthreads, 1 and 2 the consumers' ping-pong): the producer
// warpgroup's 128 threads.
__device__ __forceinline__ void ProducerBarSync() {
  asm volatile("bar.sync 3, 128;\n" ::: "memory");
}
// kTma: the consumers loaded Q alone (the producer went straight to K/V); each waits for its
// copies and fences them to the async proxy, then named barrier 4 joins the 256 consumer threads.
__device__ __forceinline__ void QReady() {
  wgmma::CpAsyncWait<0>();
  wgmma::FenceProxyAsync();
  asm volatile("bar.sync 4, 256;\n" ::: "memory");
}

// One lane's box of a tile of the TMA producer (a tile of one tensor is 2 x 128 / box_rows <= 32
// boxes: box lane / 2 of 64-dim half lane % 2, keys key_offset.. of the tile, dst_offset bytes
// into the tensor's tile); `active` false past the tile's boxes.
struct TmaBox {
  int key_offset, half;
  uint32_t dst_offset;
  bool active;
};
__device__ __forceinline__ TmaBox LaneBox(const WgmmaAttnParams& p, int lane) {
  // Dk == Dv == 128: two 64-dim panels a tile (else IssueTileBoxes).
  const int box = lane / 2, half = lane % 2;
  return {box * p.tma_box_rows, half,
          static_cast<uint32_t>(half * kHalfK + box * p.tma_box_rows * 128),
          box * p.tma_box_rows < kBlockN};
}

// This lane's box of the K (kv 0) or V (kv 1) tile of keys n0.. (all below kv_end: whole blocks
// of the sequence) into the tensor's tile at `tile_base`, completing on `bar`.
__device__ __forceinline__ void IssueBox(const WgmmaAttnParams& p, const int32_t* table, int kvh,
                                         const TmaBox& box, int n0, int kv, uint32_t tile_base,
                                         uint32_t bar) {
  const PagedSlot slot = LocateKey(table, n0 + box.key_offset, p.block_size, p.block_shift);
  const int row = static_cast<int>((slot.block * p.kv_heads + kvh) * p.block_size + slot.in_block);
  wgmma::TmaLoad2d(tile_base + box.dst_offset, kv ? &p.v_map : &p.k_map, box.half * 64, row, bar);
}

// Dk != Dv: this lane's boxes of a [kBlockN][kPanels * 64] tile of keys n0.. (K: Dk / 64 panels,
// V: 2) from `map` into `tile_base`, completing on `bar`: box i = lane + 32 j is panel i % kPanels
// of keys (i / kPanels) * box_rows.. of the tile.
template <int kPanels>
__device__ __forceinline__ void IssueTileBoxes(const WgmmaAttnParams& p, const int32_t* table,
                                               int kvh, int n0, const CUtensorMap* map,
                                               uint32_t tile_base, uint32_t bar, int lane) {
  const int boxes = kPanels * (kBlockN / p.tma_box_rows);
  for (int i = lane; i < boxes; i += 32) {
    const int panel = i % kPanels, key_offset = (i / kPanels) * p.tma_box_rows;
    const PagedSlot slot = LocateKey(table, n0 + key_offset, p.block_size, p.block_shift);
    const int row =
        static_cast<int>((slot.block * p.kv_heads + kvh) * p.block_size + slot.in_block);
    wgmma::TmaLoad2d(tile_base + panel * kHalfK + key_offset * 128, map, panel * 64, row, bar);
  }
}

// The CTA's last tile (keys n0.., reaching past kv_end) by the 128 producer threads (thread t)
// with 16-byte cp.async, keys at or past kv_end zero-filled, K and V; then waited for and
// fenced to the async proxy by every thread and joined (ProducerBarSync): the caller's one
// arrival signals all of it.
template <class S>
__device__ __forceinline__ void GatherLastTile(const WgmmaAttnParams& p, const int32_t* table,
                                               int kvh, int n0, int kv_end, uint32_t sk, int t) {
  // Once per CTA, unrolled 2: within the overlap builds' 24 producer registers.
  GatherTile<S, 2>(p, table, kvh, n0, kv_end, sk, t);
  wgmma::CpAsyncCommit();
  wgmma::CpAsyncWait<0>();
  wgmma::FenceProxyAsync();
  ProducerBarSync();
}

// The TMA producer. kSplit (the overlap variants with kOverlapSplitKv): K and V of a tile on
// their own barriers (full / empty for K, full_v / empty_v for V; ProduceSplit's protocol, each
// half issued as soon as it is free, nothing lagged); else one pair per stage. Every full
// barrier has count 1: one arrive.expect_tx (TMA tile) or one plain arrival (the gathered last
// tile) per phase. Warp 0 walks the tiles in order (its empty waits see every phase, so the
// parities never alias); warps 1-3 only join the last tile, after warp 0 has seen its stage free.
// Lane 0 arms a barrier before __syncwarp lets any lane issue onto it.
template <class S, bool kSplit>
__device__ __forceinline__ void ProduceTma(const WgmmaAttnParams& p, int b, int kvh, int kv_end,
                                           int num_tiles, uint32_t pipe) {
  constexpr int kStages = S::kStages;
  constexpr uint32_t kStageBytes = S::kStageBytes, kTileBytes = S::kKTileBytes;
  const uint32_t full = pipe + kStages * kStageBytes, empty = full + 8 * kStages;
  const uint32_t full_v = empty + 8 * kStages, empty_v = full_v + 8 * kStages;  // kSplit only
  const int t = threadIdx.x - kConsumers * 128, lane = t % 32;
  const int32_t* table = p.block_tables + b * p.table_stride;
  const int tma_tiles = kv_end / kBlockN;  // tiles with every key below kv_end
  // This lane's boxes of the K (kv 0) or V (kv 1) tile of keys n0.. in the stage at `base`.
  // Dk == Dv: the lane's one box of each, fixed for the CTA (LaneBox); else IssueTileBoxes.
  const auto issue = [&](const TmaBox& box, int n0, int kv, uint32_t base, uint32_t bar) {
    if constexpr (S::kDk == kDv) {
      if (box.active) IssueBox(p, table, kvh, box, n0, kv, base + kv * kTileBytes, bar);
    } else if (kv == 0) {
      IssueTileBoxes<S::kDk / 64>(p, table, kvh, n0, &p.k_map, base, bar, lane);
    } else {
      IssueTileBoxes<kDv / 64>(p, table, kvh, n0, &p.v_map, base + S::kKTileBytes, bar, lane);
    }
  };
  if (t < 32) {
    const TmaBox box = LaneBox(p, lane);
    for (int it = 0; it < tma_tiles; ++it) {
      const int stage = it % kStages;
      const uint32_t base = pipe + stage * kStageBytes;
      const uint32_t parity = ((it / kStages) - 1) & 1;
      if constexpr (kSplit) {
#pragma unroll
        for (int kv = 0; kv < 2; ++kv) {
          if (it >= kStages) wgmma::MbarWait((kv ? empty_v : empty) + 8 * stage, parity);
          const uint32_t bar = (kv ? full_v : full) + 8 * stage;
          if (lane == 0) wgmma::MbarArriveExpectTx(bar, kv ? kVTileBytes : S::kKTileBytes);
          __syncwarp();
          issue(box, it * kBlockN, kv, base, bar);
        }
      } else {
        if (it >= kStages) wgmma::MbarWait(empty + 8 * stage, parity);
        const uint32_t bar = full + 8 * stage;
        if (lane == 0) wgmma::MbarArriveExpectTx(bar, kStageBytes);
        __syncwarp();
        issue(box, it * kBlockN, 0, base, bar);
        issue(box, it * kBlockN, 1, base, bar);
      }
    }
  }
  if (tma_tiles == num_tiles) return;  // kv_end % kBlockN == 0: no partial tile
  const int it = num_tiles - 1, stage = it % kStages;  // it == tma_tiles
  if (t < 32 && it >= kStages) {
    wgmma::MbarWait(empty + 8 * stage, ((it / kStages) - 1) & 1);
    if constexpr (kSplit) wgmma::MbarWait(empty_v + 8 * stage, ((it / kStages) - 1) & 1);
  }
  __syncwarp();
  ProducerBarSync();  // the stage is free for all four warps
  GatherLastTile<S>(p, table, kvh, it * kBlockN, kv_end, pipe + stage * kStageBytes, t);
  if (t == 0) {
    wgmma::MbarArrive(full + 8 * stage);
    if constexpr (kSplit) wgmma::MbarArrive(full_v + 8 * stage);
  }
}

}  // namespace
}  // namespace corolla::cuda
