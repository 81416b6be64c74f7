// The CUDA backend's process-wide kernel choices (KernelTuning) and their COROLLA_* environment
// overrides (tuning.cc): every knob with what was measured for and against it.
#pragma once

#include <cstdint>

namespace corolla::cuda {

// Process-wide choices between kernel variants, read at each launch (tests and benchmarks set
// them to sweep both sides). Each field's default can be set by the COROLLA_* environment
// variable that Tuning() (tuning.cc) reads for it. Not synchronised: set them before
// launching work.
struct KernelTuning {
  // Rows of the grouped GEMM's CTA tile: 0 chooses by the mean rows per expert; 32, 64 or 128
  // forces one (tests and benchmarks sweep them). COROLLA_MOE_GEMM_TILE_ROWS sets it.
  int moe_gemm_tile_rows = 0;
  // The 128-row tiles run on the wgmma + TMA kernels (grouped_gemm_wgmma.cu) where the shapes
  // fit (N % 128, K % 64), else on mma.sync. COROLLA_MOE_GEMM_WGMMA sets it.
  bool moe_gemm_wgmma = true;
  // With moe_gemm_wgmma, the groups that pick 64-row tiles (17-64 rows an expert, or a forced
  // 64) run on the 64-row wgmma tiles; off, the 128-row wgmma tiles take the groups that pick
  // 64 (a forced 64 stays on mma.sync). Off: on an H200 (Qwen3-30B-A3B prompts, random weights,
  // where routing leaves experts uneven) the 128-row tiles took a 1024-token prompt in 17.6 ms
  // against 19.2 with the 64-row wgmma tiles and 25.9 with the mma.sync ones; the 64-row tiles
  // win only for even groups (CudaPerf.GroupedGemm's uniform routing, 64 rows an expert: the
  // op 367 vs 385 us). COROLLA_MOE_GEMM_WGMMA_TILE64 sets it.
  bool moe_gemm_wgmma_tile64 = false;
  // On the 128-row wgmma tiles, the consumer warpgroup whose 64 rows all lie past a tile's last
  // (a tile of at most 64 rows: an expert's rows past its whole tiles) issues no wgmma. On an
  // H200 (Qwen3-30B-A3B, random weights) a step of 2 x 1024 prompt tokens and 128 decode rows,
  // every expert active with ~136 rows, 42.6-42.8 vs 44.2 ms (MoE 545 vs 565-567 us a layer);
  // 1024 + 512 decode rows 32.7 vs 33.7; single prompts of 1-4k, whose routing crowds onto
  // fewer experts, within their noise. The FP8 kernel too (session 33): DeepSeek-V3 (8 layers)
  // 1k-token prompt 23.4 vs 24.0-24.6 ms, 8k within 1%. COROLLA_MOE_WGMMA_SKIP_IDLE sets it.
  bool moe_gemm_wgmma_skip_idle = true;
  // The wgmma grouped GEMMs (bf16 and FP8) walk their tiles in grouped::RoundTile's snake order
  // (rounds of the grid in alternating directions), else blockIdx.x + i gridDim.x.
  // COROLLA_MOE_GEMM_SNAKE sets it.
  bool moe_gemm_snake = true;
  // MoePermute (moe_permute.cu) takes up to this many (token, slot) pairs in one CTA (at most
  // 8192), more in three launches of CTAs of 2048 pairs; 0: three launches at every size. 4096:
  // on an H200 (E 128, k 8, `CudaPerf.MoePermute`) one CTA took 256 / 512 / 1024 tokens in 5.4 /
  // 8.1 / 13.3 us, the three launches in 7.6 / 8.2 / 8.6. COROLLA_MOE_PERMUTE_ONE_CTA_MAX_PAIRS
  // sets it.
  int64_t moe_permute_one_cta_max_pairs = 4096;
  // MoeCombine sums y with 16-byte loads, all slots' loads before their sums (CombineVecKernel,
  // the same bits as the scalar kernel). COROLLA_MOE_COMBINE_VEC=0 takes the scalar kernel.
  bool moe_combine_vec = true;
  // MoeExperts' grouped paths keep the down GEMM's per-row output y in bf16 (16-byte stores
  // through a quad transpose of the fragments; the combine reads half the bytes) instead of f32.
  // Each expert's row is rounded to bf16 before the weighted sum, as Hugging Face's bf16 MoE
  // blocks do. On an H200 (Qwen3-30B-A3B, random weights) prompts of 256 / 1k / 2k / 8k tokens
  // took 8.49-8.52 / 16.07-16.13 / 28.88-29.07 / 136.5-137.0 ms against 8.74-8.86 / 16.84-16.96 /
  // 30.30-30.40 / 141.7-142.1 with y in f32; decode batch 64 / 256 at ctx 1k 18.68-18.69 /
  // 24.46-24.47 against 18.85-18.87 / 24.65-24.67. COROLLA_MOE_Y_BF16=0 keeps f32.
  bool moe_y_bf16 = true;
  // MoeExperts skips the permutation and runs one GEMV per (token, expert) pair, the down
  // projection combining in registers (moe_decode.cu), when tokens * top_k <= this (bf16 and
  // FP8 experts). 64: on an H200 (E 128, k 8) 26 vs 55 us at 1 token, 129 vs 176 us at 8 against
  // permute + GEMV. Not higher, though on an H100 (Qwen3-30B-A3B decode, ctx 1k, random
  // weights, session 52) the pairs were ahead up to 22 tokens: batch 12 / 16 / 22 12.847 /
  // 15.164 / 18.524 ms against 13.817 / 15.777 / 18.862 for the weight streams below (one call),
  // and 192 pairs lost (batch 24 19.594 vs 19.505 on the grouped GEMMs). A pair reads its expert
  // once a pair, so rows that crowd onto few experts cost a multiple of their bytes: prompts of
  // 12 / 20 tokens took 8.017 / 12.079 ms with the pairs up to 176 against 6.035 / 6.781 with 64
  // (the same call), and a decode batch of samples of one prompt would route alike. The streams
  // read an expert once a pass of 16 rows. Pairs of one expert grouped into one read lost both
  // ways (session 53, notes/moe_gemm.md). COROLLA_MOE_PAIR_GEMV_MAX_PAIRS sets it.
  int64_t moe_pair_gemv_max_pairs = 64;
  // MoeExperts (bf16) past the pair GEMVs and up to this many pairs, unless the step is mostly
  // one prompt's (Backend::PlanStep): the permutation, then the experts as weight streams
  // (moe_skinny.cu: each chosen expert read once, straight into mma.sync, against its 1-16 rows a
  // pass) instead of the grouped mma GEMMs. 1024: on an H100 (Qwen3-30B-A3B decode, ctx 1k,
  // session 52, two rounds) batch 24 / 32 / 48 / 64 / 128 19.299-19.316 / 21.083-21.093 /
  // 23.092-23.093 / 23.876-23.880 / 26.628-26.650 ms against 19.522 / 21.427-21.435 /
  // 23.421-23.436 / 24.375-24.390 / 27.180-27.207 on the grouped GEMMs (88.8 -> 90.9% of the copy
  // bandwidth at 64); batch 12 / 16 13.817 / 15.777 (another call; the grouped GEMMs took 14.249 /
  // 16.061-16.089 on a machine as fast). Alone (CudaPerf.MoeDecodePairVsPermute) the two read
  // ~2.8-2.9 TB/s from 24 tokens on, so the step's gain is mostly the streams' programmatic
  // launch. Batch 256 (2048 pairs, ~16 rows an expert, ctx 512) lost: 35.658 vs 28.222 ms, and
  // on 32-row passes too (session 53, notes/moe_gemm.md). COROLLA_MOE_SKINNY_MAX_PAIRS sets it.
  int64_t moe_skinny_max_pairs = 1024;
  // Linear with at most this many rows of x (<= 8) runs the GEMV of gemv.cu, else the stream
  // below. 1: at 2 rows the GEMV ran o_proj at 1.60 TB/s (10.5 us, H100); the tensor-core stream
  // took batch-2 decode from 4.486-4.495 to 4.229 ms on an H100 (ctx 1k, 70.9 -> 75.2% of the
  // copy bandwidth). COROLLA_LINEAR_GEMV_MAX_ROWS sets it.
  int linear_gemv_max_rows = 1;
  // Linear with more rows than that and at most this many (<= 16) runs the tensor-core weight
  // stream of gemm_skinny.cu, else cuBLASLt. COROLLA_LINEAR_MMA_MAX_ROWS sets it (0: cuBLASLt).
  int linear_mma_max_rows = 16;
  // Decode attention splits each sequence's keys across CTAs until the grid has at least this
  // many CTAs (0: never split); the decode kernel (attention_decode.cu) at most this many, with
  // attention_decode_one_wave.
  int attention_split_min_ctas = 264;
  // The decode kernel's split plan keeps its grid one wave: floor(attention_split_min_ctas /
  // (sequences x KV heads)) splits, not the ceiling (batch 16 of Qwen3-30B-A3B: 4 splits, 256
  // CTAs, not 5 and 320), and where the splits merge as clusters, at most as many as let every
  // (sequence, KV head)'s cluster be resident at once (cudaOccupancyMaxActiveClusters: on an H100
  // 30 clusters of 8 CTAs, so batch 8's 32 clusters of 8 splits ran as two waves, the last two
  // entering ~12 us late). COROLLA_ATTN_DECODE_ONE_WAVE.
  bool attention_decode_one_wave = true;
  // A decode batch whose splits merge as clusters (attention_decode_cluster_merge_seqs, groups
  // <= 8) plans them for this many CTAs instead, where that leaves 2-15 splits: one CTA an SM
  // (the cluster build holds 255 registers). On an H100 (Qwen3-30B-A3B, graph, two rounds, ms a
  // step) with 132 against 264 (session 39 call 4): ctx 1024 batch 4 6.286-6.290 vs 6.483-6.492,
  // batch 8 9.806-9.811 vs 10.017-10.031; ctx 2048 batch 4 6.486-6.488 vs 6.691-6.695, batch 8
  // 10.205-10.209 vs 10.388-10.401; ctx 8192 batch 3 6.279-6.291 vs 6.399-6.405, batch 4
  // 7.639-7.644 vs 8.072-8.089, batch 8 12.352-12.361 vs 12.673-12.712; batch 1 and 16 the same.
  // COROLLA_ATTN_DECODE_CLUSTER_MIN_CTAS.
  int attention_decode_cluster_min_ctas = 132;
  // Attention runs on the tensor-core kernels (attention_mma.cu; mla_decode.cu for MLA decode)
  // for the shapes they support, else on the SIMT one.
  bool attention_mma = true;
  // GatedDeltaRule runs a sequence's chunk of at least this many new tokens on the chunked
  // tensor-core kernel (gated_delta_chunked.cu), shorter ones (decode) on the recurrent one.
  // 64: one full chunk, as the CPU twin's kGatedDeltaChunkedMinTokens. 1 forces every sequence
  // onto the chunked kernel; a huge value keeps all on the recurrent one.
  int64_t gated_delta_chunked_min_tokens = 64;
  // MLA decode's KV splits per sequence: 0 plans them (mla_decode.cu), n > 0 forces n (capped
  // by the key tiles of max_seq_len; tests sweep it). COROLLA_MLA_DECODE_SPLITS sets it.
  int mla_decode_splits = 0;
  // Split-KV decode on the tensor-core kernel merges the splits in the last CTA of each (row
  // tile, KV head, sequence) to finish, instead of a separate merge launch.
  bool attention_fused_merge = true;
  // Decode kernels (GEMV, norms, attention prologue/attention, router, pair MoE) are launched
  // with programmatic dependent launch (pdl.cuh).
  bool pdl = true;
  // MoeRouter (router GEMV + routing in one launch, router.cu) for up to this many tokens
  // (<= 8); more take Linear + MoeRoute. 0 (off): on an H200 the fused kernel took 9.8 us at
  // 1 token against 8.3 for the GEMV + MoeRoute pair (22 vs 12 at 8): its 8-CTA cluster is
  // bound by what 8 SMs pull from L2. Tests and benchmarks set it.
  int fused_router_max_tokens = 0;
  // MoeRouter of one token runs the staged router (router.cu: a warp per router row staged in
  // shared memory before the dependency wait, the last warp to arrive routes) instead of Linear +
  // MoeRoute: one launch instead of two. Off: slower on an H200 (Qwen3-30B-A3B batch 1, graph,
  // session 7: 3.050 vs 2.783 ms a step; notes/decode_step.md). COROLLA_STAGED_ROUTER sets it.
  bool staged_router = false;
  // Backend::RmsNormMoeRouter of one token folds the norm into the staged router (every warp
  // forms sum + y and its norm itself; the last warp to arrive writes sum and x back): one launch
  // instead of RmsNorm + router. Off: slower on an H200 (session 7: 3.121 vs 2.783 ms a step);
  // the cluster norm-router below took its place. COROLLA_STAGED_ROUTER_NORM sets it.
  bool staged_router_norm = false;
  // Backend::RmsNormMoeRouter of one token runs as one thread block cluster of this many CTAs
  // (16 or 8; router_norm.cu): the post-attention norm, the router logits and the routing in
  // one launch, the logits exchanged through distributed shared memory; the same bits as the
  // three kernels where the router GEMV takes a row a CTA. 0 (or a cluster the device cannot
  // place): RmsNorm, the router GEMV and MoeRoute, or the staged router above. On an H200
  // (Qwen3-30B-A3B, batch 1, graph, four calls) 16: 2.540-2.554 vs 2.557-2.568 ms at ctx 1024,
  // 2.941-2.955 vs 2.960-2.962 at 8192; 8: 2.657 (its CTAs hold 64 KB of rows each).
  // COROLLA_CLUSTER_NORM_ROUTER sets it.
  int cluster_norm_router = 16;
  // The cluster takes batches of up to this many tokens (<= 8; more run the three kernels): past
  // one token CTA r forms token r's row and writes it back, one cluster barrier, then every CTA
  // reads every token's x through L2 and dots its router rows with it on the tensor cores. On an
  // H100 (Qwen3-30B-A3B, ctx 1024, graph, two rounds, session 41 call 3, ms a step) batch 2 / 3 /
  // 4 / 8 4.136 / 5.190 / 6.213-6.233 / 9.762-9.791 against 4.165 / 5.255-5.260 / 6.283-6.287 /
  // 9.813-9.815 with session 40's cluster at 2 tokens and the three kernels past that: at 8
  // tokens the kernel runs 5.97 us after its wait (8.26 with every CTA forming every row, 7.24
  // with x read through DSMEM: ~25 GB/s out of the forming SM), the three kernels' paths ~8.7.
  // COROLLA_CLUSTER_NORM_ROUTER_MAX_TOKENS.
  int cluster_norm_router_max_tokens = 8;
  // That cluster holds its router rows in registers where a warp has at most one row of at most
  // 2048 (Qwen3-30B-A3B) instead of bulk-copying them to shared memory, so its CTAs (~6 KB of
  // shared memory) wait beside the o_proj GEMV's (entering 3.1 us before it ends, not 0.8); same
  // bits. On an H200 (batch 1, graph, one call, two runs each): 2.460 / 2.463 vs 2.458 / 2.468 ms
  // at ctx 1024, 2.902 / 2.901 vs 2.915 / 2.913 at 8192. COROLLA_CLUSTER_NORM_ROUTER_REGS.
  bool cluster_norm_router_regs = true;
  // With register rows at one token, the CTAs push their logits into CTA 0 with st.async, which
  // completes bytes on an mbarrier there, instead of DSMEM stores and a cluster barrier: the
  // barrier's release arrival waits for the CTA's stores to be performed, ~1.4 us longer beside
  // gate/up's prefetches on the router's SMs (session 56, the router's mark 1 -> 2). The write-back
  // of sum and x waits on a relaxed cluster barrier instead (the reads it must follow are over,
  // their values summed into the logit). Same bits. Session 57's first form hung on the H100
  // (its cluster barriers as inline .aligned PTX after divergent code); it runs on the compiler's
  // barrier intrinsics since. Session 58 (H100, batch 1, graph, two rounds): with routing by the
  // logits 2.807 / 2.815 ms at ctx 1024 against 2.838 / 2.842 for routing by the logits alone and
  // 2.857 / 2.878 for neither; the exchange (mark 1 -> 2) 0.08 us against 0.62, the router 3.28
  // us against 3.89 / 4.36. Its test: RmsNormMoeRouterFusedAsync. COROLLA_CLUSTER_NORM_ROUTER_ASYNC.
  bool cluster_norm_router_async = true;
  // Renormalised softmax routing (Qwen3-MoE's) ranks the experts by their logits and weighs the
  // picks by exp(l - l_max) / their sum in f32 (RouteTokenByLogits, moe_route.cuh) instead of
  // forming every expert's score with a double sum: the picks only, ~half of one warp's routing
  // by the probe's split (session 41: 1357 of 2772 cycles the scores). Weights within a few f32
  // ulps of the scores' routing; near ties may order differently. Session 58 (H100, batch 1,
  // graph, two rounds): 2.838 / 2.842 ms at ctx 1024 against 2.857 / 2.878, 3.200 / 3.204 against
  // 3.217 / 3.230 at 8192; the router 3.89 us against 4.36; the probe 1771 cycles against 2729.
  // Batches 2 / 8 / 32 / 128 at 1k (call 2, another H100): 4.103 / 9.751 / 21.095 / 26.576 ms
  // against 4.128 / 9.781 / 21.099 / 26.606.
  // Its tests: RmsNormMoeRouterFused's mode 19, RouteTokenPicks' mode 4. COROLLA_ROUTE_BY_LOGITS.
  bool route_by_logits = true;
  // Backend::RmsNormLinear of one row (a layer's input norm and qkv projection) folds the norm
  // into the staged GEMV (every CTA forms sum + y and its norm; the last CTA to arrive writes sum
  // and x back): one launch instead of two. Off: slower on an H200 (Qwen3-30B-A3B batch 1, graph,
  // session 10: 2.492 vs 2.467 ms a step at ctx 1024, 2.926 vs 2.905 at 8192). COROLLA_GEMV_STAGED_NORM.
  bool gemv_staged_norm = false;
  // The pair path's down + combine spreads the top-k slots over 8 warps of a CTA, the first
  // weight loads issued before the dependency wait (PairDownSlotsKernel); off: one warp walks
  // all slots of its rows (PairDownCombineKernel). On an H200 (Qwen3-30B-A3B experts, one
  // token) 22.3 against 26.2 us; the B1 decode step 3.166 -> 3.046 ms. (An L2 prefetch of the
  // pairs' W_down from the gate/up CTAs was tried too: slower, 3.38 ms.)
  bool moe_pair_down_slots = true;
  // Prefill attention at D 128 (a sequence with more than 16 query tokens: no split-KV) runs on
  // the wgmma kernel (attention_wgmma.cu) on sm_90 when Tuning().attention_mma is on too; off:
  // the mma.sync kernel (attention_mma.cu). COROLLA_ATTN_WGMMA sets it.
  bool attention_wgmma = true;
  // LinearFp8 with at most this many rows of x (<= 8) runs the FP8 GEMV of fp8_gemv.cu (the
  // activation quantisation fused in, one launch), else quantise + cuBLASLt (3 launches). 1: on
  // an H200 (CudaPerf.Fp8Gemv, DeepSeek-V3 decode shapes) the GEMV beats quantise + cuBLASLt at
  // one row on the small weights (1.2-1.9x) and ties on the large ones, but loses from 4 rows on
  // (0.3-0.9x): it is instruction-bound (33-69% of the copy rate at one row).
  // COROLLA_LINEAR_FP8_GEMV_MAX_ROWS sets it.
  int linear_fp8_gemv_max_rows = 1;
  // MoeExpertsFp8's grouped GEMMs at 128-row tiles (prefill) run on the wgmma + TMA kernels
  // (moe_fp8_wgmma.cu) on sm_90 where the shapes fit (N % 64, K % 16), else on mma.sync
  // (moe_fp8.cu). COROLLA_MOE_FP8_WGMMA sets it.
  bool moe_fp8_wgmma = true;
  // Width of moe_fp8_wgmma.cu's tile: 256 (GateUp 128 gate + 128 up rows; setmaxnreg 232 for
  // the consumers; 3/4 of the smem traffic per MAC of 128) or 128 (64 + 64; no setmaxnreg).
  // COROLLA_MOE_FP8_WGMMA_TILE_N sets it.
  int moe_fp8_wgmma_tile_n = 256;
  // Which build of the wgmma prefill kernel (attention_wgmma.cu) runs: 0 the base one; 1 the
  // grid walks (row tile, KV head) with KV heads fastest (the heaviest causal row tiles of every
  // head first); 2 as 1 plus FlashAttention-3's intra-warpgroup overlap (S of tile j + 1 and
  // P V of tile j in flight together, softmax under the P V); 3 as 2 plus the ping-pong of the
  // two consumer warpgroups (named barriers); 4 and 5 as 2 and 3 with a leaner softmax
  // (ex2.approx.ftz, the scale folded into one FFMA). Out-of-range values clamp. Tests and
  // CudaPerf sweep them. Measured on an H200 (Hq 32 / Hk 4, causal, 1k / 4k / 8k tokens) with
  // the TMA producer: 0 169 / 391 / 445 TFLOP/s, 1 195 / 397 / 457, 2 190 / 388 / 438, 3 193 /
  // 386 / 426, 4 204 / 440 / 505, 5 216 / 457 / 524 (Qwen3-30B-A3B prefill at 8k: 59.6% of the
  // matmul peak with 5, 58.1% with 0), so 5. With the cp.async producer the overlap builds
  // starve (2-5 at 0.65-0.72x of 0). COROLLA_ATTN_WGMMA_VARIANT sets it.
  int attention_wgmma_variant = 5;
  // The wgmma prefill kernel's K/V tiles come by TMA (cp.async.bulk.tensor: one warp issues a
  // box per cache block, completion by transaction count; the last, partial tile of a CTA
  // still by the cp.async zero fill) where the cache allows it (block_size a power of two >= 8,
  // dense, aligned); off, or other block sizes: the 128-thread cp.async gather through the block
  // table. COROLLA_ATTN_TMA sets it.
  bool attention_wgmma_tma = true;
  // The order of the wgmma prefill kernel's flattened grid (variants >= 1): 1 the KV heads
  // fastest, 0 a KV head's row tiles together (they share its K/V through L2), -1 chooses: heads
  // fastest where the K/V of every KV head fits in 24 MB of L2 (Qwen3-30B-A3B up to ~12k
  // tokens), else rows (DeepSeek-V3's 128 heads). COROLLA_ATTN_WGMMA_HEADS_FASTEST sets it.
  int attention_wgmma_heads_fastest = -1;
  // A step that decodes some sequences beside others' prompt chunks (AttentionBatch::
  // num_decode_seqs leading one-token sequences): those rows go to the decode kernel, the
  // prompts alone to the wgmma kernel, whose grid is row tiles x KV heads x sequences (a decode
  // row fills one tile of its sequence's, and the rest of its CTAs exit at once).
  // COROLLA_ATTN_MIXED_DECODE sets it.
  bool attention_mixed_decode = true;
  // Preferred shared-memory carveout (percent of the unified L1 / shared memory) that LaunchPdl
  // sets on each kernel it launches; -1 leaves the driver's choice. A kernel whose shared memory
  // needs another carveout than the kernel still running on an SM cannot start there until it
  // drains, which defeats programmatic dependent launch. Off: 100 on an H200 made the
  // Qwen3-30B-A3B batch-1 step faster (3.068 vs 3.145 ms) but batch 8 slower (10.33 vs 9.38: the
  // GEMVs lose L1). COROLLA_PDL_CARVEOUT sets it.
  int pdl_carveout = -1;
  // The same for the staged GEMV alone (gemv_staged_carveout) and the small-batch decode
  // attention alone (attention_decode_carveout); pdl_carveout, where set, wins. The driver picks
  // the smallest carveout that holds a kernel's shared memory: the staged qkv's 161 KB take the
  // 164 KB one, leaving no room beside it for the attention's ~13 KB. Off: slower on an H200
  // (Qwen3-30B-A3B batch 1, graph, ctx 1024, session 13, same call: default 2.408-2.410 ms):
  // 100 for the staged GEMV 2.535-2.541 (the MoE's gate/up then lands on SMs left at the 228 KB
  // carveout, small L1: its run 8.6 vs 6.2 us), with the fused prologue 2.619-2.630 (its CTAs
  // enter beside qkv, but their wait returns ~5 us after qkv's exit); 100 for the attention
  // 2.446-2.477 (all of o_proj's CTAs enter beside it, o_proj's run 3.7 vs 4.7 us, but the
  // attention's wait returns ~3.4 us after the prologue's exit, once o_proj's 16.8 MB of copies
  // have landed, against 1.1-1.9). COROLLA_GEMV_STAGED_CARVEOUT, COROLLA_ATTN_DECODE_CARVEOUT.
  int gemv_staged_carveout = -1;
  int attention_decode_carveout = -1;
  // The staged GEMV's carveout on a stream whose decode attention folds its prologue in
  // (attention_fused_prologue_min_keys; SetStagedGemvBesideFoldedAttention): 84, the 196 KB
  // carveout, holds qkv's 161 KB and an attention CTA's ~13 KB side by side. On an H200
  // (Qwen3-30B-A3B, batch 1, graph, session 17, call 3) folded at ctx 8192 2.648-2.656 ms with
  // it, 2.725-2.726 without; on every stream it cost 1k a little (2.348 vs 2.340-2.341 in call 4,
  // 2.363-2.364 vs 2.350-2.351 in call 5), hence only beside the folded attention.
  // COROLLA_GEMV_STAGED_CARVEOUT_FOLDED.
  int gemv_staged_carveout_folded = 84;
  // The staged GEMV's warps issue their bulk copies spread over this many nanoseconds after the
  // CTA's entry (warp w after w / 16 of it) instead of all at once (0), so that the kernels on
  // the critical path do not wait behind copies at the full HBM rate. Off: slower on an H200
  // (as above, another call: default 2.409-2.413 ms): 3000 ns 2.465-2.466, 6000 2.552-2.554;
  // with the attention at the 100 carveout 2.495-2.499 (3000 and 6000), 2.627-2.629 (9000).
  // At 3000 the RmsNorm after the MoE returns from its wait 0.8 us after the down kernel's exit
  // and runs 1.3 (against 2.8 and 2.1), but qkv's copies land late: its run 6.8 vs 3.1 us.
  // COROLLA_GEMV_STAGED_SPREAD_NS sets it.
  int gemv_staged_spread_ns = 0;
  // At most this many of a staged GEMV CTA's 16 warp copies in flight at once (warp w issues once
  // warp w - depth's copy has landed; 0: all at entry), so that fewer bytes are in flight
  // GPU-wide than a whole projection's (o_proj 16.8 MB, qkv 21 MB), which the chain's loads,
  // barriers and releases queue behind. gemv_staged_depth: the staged GEMV without a folded norm
  // (o_proj at batch 1); gemv_staged_depth_norm: with one (qkv). Off: slower on an H100
  // (Qwen3-30B-A3B, batch 1, ctx 1024, graph, session 45; default 2.810-2.816 ms in call 1,
  // 2.833-2.834 in call 2): both at 4 2.947-2.950, both at 8 2.876-2.880, o_proj at 8 2.857,
  // qkv at 8 2.876-2.877; with the attention's trigger at entry (attention_decode_trigger 0)
  // 2.904-2.906, o_proj at 4 / 8 then 2.913-2.914 / 2.898-2.900. Paced, the attention ran
  // 0.6-1 us shorter and qkv's wait returned ~1 us sooner, but the projections' runs grew 1-3
  // us: 4-10 MB in flight do not keep the HBM at its rate under this load.
  // COROLLA_GEMV_STAGED_DEPTH, COROLLA_GEMV_STAGED_DEPTH_NORM.
  int gemv_staged_depth = 0;
  int gemv_staged_depth_norm = 0;
  // The one-row GEMV with two rows a warp (gemv.cu) is built for 5 CTAs an SM (registers capped
  // at 96, no spills) so that 4224 <= N < 8448 runs in one wave; off: 4 an SM, two waves.
  // COROLLA_GEMV_ONE_WAVE sets it.
  bool gemv_one_wave = true;
  // Linear with one row of x runs the staged GEMV (gemv.cu: one CTA an SM, its whole slice of W
  // bulk-copied to shared memory before the dependency wait) where a slice fits; off: GemvKernel.
  // Alone it is no faster (qkv 5.5 vs 5.1 us, o_proj 5.1 vs 5.6); in the decode step its copies
  // overlap the kernels before it: on an H200 (Qwen3-30B-A3B, batch 1, graph) with
  // pdl_early_trigger 2.774-2.779 vs 2.892 ms at ctx 1024, 3.105-3.114 vs 3.224 at 8192.
  // COROLLA_GEMV_STAGED sets it.
  bool gemv_staged = true;
  // RmsNorm and the decode attention let the next kernel launch before their own dependency wait
  // (pdl.cuh: safe, the next kernel still waits for this one), so that a staged GEMV after them
  // starts its weight copies earlier (batch-1 step 2.805 -> 2.779 ms, 2.788 -> 2.774 in two
  // runs). COROLLA_PDL_EARLY_TRIGGER sets it.
  bool pdl_early_trigger = true;
  // Where the decode attention lets the next kernel launch: 0 at entry (its share of
  // pdl_early_trigger, which 0 needs), 1 after its dependency wait, 2 after its passes (before the
  // merge) where the splits merge as a cluster, else after the wait. The later, the less of the
  // staged o_proj's copies (launched by the trigger) land while the attention waits and loads:
  // copies in flight hold back a wait's return and a handover (session 13; session 14 saw the
  // qkv GEMV's wait return 4 us after RmsNorm's exit with its own 21 MB landing). On an H200
  // (Qwen3-30B-A3B, batch 1, graph, two rounds a call, session 14), 1 against 0: 2.384-2.387 vs
  // 2.411-2.420 ms at ctx 1024, 2.908-2.909 vs 2.936 at 8192; in a second call 2.445-2.454 vs
  // 2.492-2.495 and 2.922-2.931 vs 2.941-2.944. 2 against 1 (a third call): 2.336-2.344 vs
  // 2.380-2.383 at 1024 (the attention's path 6.9 vs 7.5 us, o_proj's 5.3 vs 5.4), and at 8192
  // (the counter merge) after the passes too 2.918-2.923 vs 2.908-2.913: there it stays at 1;
  // after the passes beside the wide merge too (session 17, ctx 8192, 64 splits): a tie, 2.712-
  // 2.719 vs 2.711-2.718.
  // Batch 8 / 64 (no cluster) unchanged: 8.366 vs 8.374 ms, 19.967 vs 19.935.
  // COROLLA_ATTN_DECODE_TRIGGER sets it.
  int attention_decode_trigger = 2;
  // RmsNorm's share of pdl_early_trigger: off, it triggers after its wait, so that the staged qkv
  // GEMV's copies (21 MB at Qwen3-30B-A3B) start after the norm's wait returns instead of while
  // it waits for the MoE down kernel. Off is slower: the norm's path falls from 5.2 to 2.3 us but
  // the qkv GEMV's wait then returns 4.0 us after the norm (its copies landing), its path 7.4 us
  // against 3.9; on an H200 (session 14, same call) 2.419 vs 2.380-2.383 ms at ctx 1024, 2.944-
  // 2.949 vs 2.908-2.913 at 8192. COROLLA_RMSNORM_EARLY_TRIGGER sets it.
  bool rmsnorm_early_trigger = true;
  // QkNormRopeKvWrite triggers its dependents before its own wait too, so the decode attention
  // (and, through its early trigger, the staged o_proj's weight copies) start one kernel earlier.
  // Off: no faster on an H200 (session 10: 2.460 vs 2.467 ms at ctx 1024, 2.950 vs 2.905 at
  // 8192). COROLLA_PROLOGUE_EARLY_TRIGGER sets it.
  bool prologue_early_trigger = false;
  // QkNormRopeKvWrite reads its slot and position, forms the rotation and loads the norm weights
  // before its dependency wait (what no kernel of the forward writes), leaving the step's q / k /
  // v and the math after it. Not yet measured (session 12 wrote it after the device budget was
  // spent): off. COROLLA_PROLOGUE_EARLY_LOADS sets it.
  bool prologue_early_loads = false;
  // QkNormRopeKvWrite of many tokens (prefill) with a warp per token walking all its heads (the
  // rotation's angles and the norm weights formed once a token) instead of a warp per 4 heads.
  // On an H200 (Qwen3-30B-A3B, prefill of 8192 tokens, session 18 call 8) 147.73-147.82 ms a
  // prompt against 148.99-149.00 with the build before (a warp per 4 heads, every lane all its
  // angles, the norm weights in local memory) and 148.60-149.30 with it off; the op ~86 us a layer
  // (`--breakdown`, eager) instead of ~105. Below prologue_warp_per_token_min_tokens the warp a
  // token leaves too few warps to fill the SMs. COROLLA_PROLOGUE_WARP_PER_TOKEN=0 turns it off.
  bool prologue_warp_per_token = true;
  // The fewest tokens that take the warp a token (above). 2048: on an H200 (Qwen3-30B-A3B
  // prompts, session 22) the warp per 4 heads took 512 / 1024 tokens in 15.59-15.66 / 25.32-25.43
  // ms against 16.22-16.29 / 25.83-25.89, tied at 2048 (31.18-31.47 vs 31.08-31.20) and lost at
  // 8192 (145.22-145.36 vs 144.14-144.63). COROLLA_PROLOGUE_WARP_PER_TOKEN_MIN_TOKENS sets it.
  int64_t prologue_warp_per_token_min_tokens = 2048;
  // The few-token MoE pair kernels' shapes (moe_decode.cu): outputs a warp of the gate/up GEMV (2
  // or 4) and W_down rows a CTA of the down GEMV (4 or 8; 8 runs Qwen3-30B-A3B's batch-1 down in
  // one wave of 256 CTAs instead of two of 512). On an H200 (Qwen3-30B-A3B, ctx 1024, graph) down
  // 8: batch 1 2.553 vs 2.652 ms, batch 8 8.369 vs 8.599; gate/up 4: 2.657 and 8.677 (not kept).
  // COROLLA_MOE_PAIR_GATE_UP_ROWS and COROLLA_MOE_PAIR_DOWN_ROWS set them.
  int moe_pair_gate_up_rows = 2;
  // The two-output gate/up kernel with the token's x row in shared memory and registers capped
  // for 6 CTAs an SM, keeping its 16 chunks a lane in flight: Qwen3-30B-A3B's 768 batch-1 CTAs in
  // one wave (the default's 106 registers allow 4 an SM: 528 + 240). Session 14 built the default
  // for 5 an SM (96 registers, spills: 2.485 vs 2.332-2.339 ms) and for 6 with 12 chunks in flight
  // (2.365-2.368). Slower too (session 15, one call): 2.420-2.421 vs 2.355 ms at ctx 1024,
  // 2.965-2.967 vs 2.899-2.901 at 8192: with all 768 CTAs resident the down kernel's CTAs cannot
  // enter during gate/up's tail. COROLLA_MOE_PAIR_GATE_UP_ONE_WAVE=1 sets it.
  bool moe_pair_gate_up_one_wave = false;
  // An experiment, never a default (issue 4, session 55): the batch-1 gate/up CTAs prefetch into
  // L2, before their dependency wait, the rows they would read for a predicted expert, so that
  // the routing's window (HBM idle) moves expert bytes. The prediction here is the layer's picks
  // in the previous forward (the down kernel records them, keyed by the layer's gate/up weights):
  // a bench replaying one step always hits it, so this measures the mechanism's upper bound, not
  // a predictor. 1: each CTA its own rows; 2: the grid's first half its own and the second
  // half's too. On an H100 (Qwen3-30B-A3B, batch 1, graph, sessions 55-56): 1 2.784-2.788 and 2
  // 2.739-2.752 vs 2.829-2.831 ms at ctx 1024, 3.192-3.214 vs 3.224-3.230 at 8192; the router's
  // cluster barrier +1.6 us (session 56: not with the router's SMs left out, but then its
  // routing took 2.2 us longer: 2.781 / 3.343 ms, removed). COROLLA_MOE_PREFETCH_PREVIOUS.
  int moe_prefetch_previous = 0;
  // With moe_prefetch_previous > 0, the picks prefetched are predicted instead (a real
  // predictor, session 56): before their dependency wait the first CTAs of the batch-1 o_proj
  // (the staged GEMV, gemv.cu) route the layer's input as it was before the attention (the
  // residual sum, ranks only: no 1 / rms) with the layer's router (Backend::HintMoeRouting), the
  // last of them picks the top k, which gate/up's CTAs prefetch (the router's wait on o_proj
  // orders them). Session 56 (H100, graph): 2.818-2.822 vs 2.826-2.839 ms at ctx 1024, a tie at
  // 8192 (prev2 2.738-2.744 in another call), 89.6% of picks predicted on random weights; the
  // CTA that picks the top k returns from its wait ~2.6 us late (o_proj +0.8 us a layer), the
  // router's barrier +1.6 beside the prefetches. Not a default while it gains this little.
  // (Session 55's form, the norm-router predicting before its own wait, took ~5.4 us and held
  // the routing: 3.543 vs 2.830 ms.) COROLLA_MOE_PREDICT=1.
  // (Mode 2, session 57: o_proj's CTAs only posted the logits and the norm-router's CTA 0 picked
  // before its wait: 2.891-2.896 vs 1's 2.855-2.860 ms, the router +0.7 us a layer; removed.)
  int moe_predict = 0;
  // An experiment, never a default (issue 4, session 60): the batch-1 qkv projection's CTAs (the
  // staged NormLinear) issue L2 prefetches, as they leave, of the first moe_prefetch_qkv rows of
  // each picked expert's gate and up halves and the first moe_prefetch_qkv_down rows of its
  // W_down, so that the window from qkv's exit to the attention's trigger (HBM nearly idle: the
  // prologue and the attention's passes) moves expert bytes. The picks are the layer's in the
  // previous forward (moe_prefetch_previous's record): a bench replaying one step always hits
  // them, so this measures the window's upper bound, as moe_prefetch_previous did for the
  // routing's. moe_prefetch_qkv_last: the prefetches under evict_last instead of evict_normal.
  // moe_prefetch_qkv_predict: the picks predicted instead, by a launch of their own just before
  // qkv's (MoePredictKernel, gemv.cu: the layer's input times the post-attention norm's
  // weights, ranks only, dotted with the router's rows after its dependency wait; the last CTA
  // picks the top k); qkv's CTAs prefetch where the prediction is there as they leave, and the
  // down kernel counts the picks it held (`bench decode` prints the share after its eager steps).
  // With moe_prefetch_previous > 0 gate/up's CTAs prefetch the same prediction in the routing's
  // window. COROLLA_MOE_PREFETCH_QKV, COROLLA_MOE_PREFETCH_QKV_DOWN, COROLLA_MOE_PREFETCH_QKV_LAST,
  // COROLLA_MOE_PREFETCH_QKV_PREDICT. (Written in session 60, not yet run on a GPU.)
  int moe_prefetch_qkv = 0;
  int moe_prefetch_qkv_down = 0;
  bool moe_prefetch_qkv_last = false;
  bool moe_prefetch_qkv_predict = false;
  // A MoE layer's output folded into the residual stream at batch 1 (Backend::folds_moe_residual):
  // the down kernel adds its rows into the stream's sum and the next layer's qkv GEMV norms that
  // sum as it stages x (NormLinear), so that no RmsNorm kernel runs between them (its release and
  // run under the qkv copies: 4.8-5.4 us a layer in session 15's eager timelines; the qkv GEMV's path
  // grows from 4.3 to 7.6 us instead of 4.3 + 5.4). On an H200 (session 15, Qwen3-30B-A3B, graph,
  // two calls): 2.322-2.323 vs 2.351-2.352 and 2.367-2.370 vs 2.423-2.424 ms at ctx 1024,
  // 2.898-2.902 vs 2.929-2.932 and 2.900-2.905 vs 2.943-2.947 at 8192.
  // COROLLA_MOE_RESIDUAL_FOLD=0 turns it off.
  bool moe_residual_fold = true;
  int moe_pair_down_rows = 8;
  // Decode attention (every sequence one query token, Dk = Dv in {64, 128, 256}, separate K/V,
  // GQA group <= 16) runs on the small-batch decode kernel (attention_decode.cu: all of a CTA's
  // loads issued at once into registers, mma.sync straight from them, ~12 KB of static shared
  // memory) instead of attention_mma.cu's. On an H200 (Hq 32 / Hk 4 / D 128, graph): batch 1
  // ctx 1024 6.92 vs 9.79 us, ctx 8192 12.4 vs 23.2, batch 64 49.7 vs 54.2. COROLLA_ATTN_DECODE
  // sets it.
  bool attention_decode_kernel = true;
  // That kernel's split-KV plan: at least this many keys a split (16..; rounded to 16). Fewer
  // keys mean more CTAs but more partials for the last CTA to merge. COROLLA_ATTN_DECODE_SPLIT_KEYS.
  int attention_decode_split_keys = 64;
  // And at most this many f32 partials (group x splits x D) for a KV head's merge: 65536 lets
  // Qwen3's 8k-key decode (group 8, D 128) run 64 splits of 128 keys (kMaxMergeRows / group caps
  // it there), which the wide merge (below) takes at batch 1. On an H200 (Qwen3-30B-A3B, batch 1,
  // graph, session 17, same call) 2.710-2.711 vs 2.809-2.813 ms a step at ctx 8192 (32 splits of
  // 256 keys at 32768); 1k unchanged (16 splits either way: 2.310 vs 2.308-2.310); batches past 4
  // sequences plan fewer splits (attention_split_min_ctas) and do not change. Under the last-CTA
  // merge 65536 lost (session 11: 3.058 vs 2.964). COROLLA_ATTN_DECODE_MERGE_FLOATS.
  int attention_decode_merge_floats = 65536;
  // In decode batches of at most this many sequences (0: never), that kernel's splits of a
  // (sequence, KV head) run as one thread block cluster (2-16 splits, groups <= 8) and merge
  // through distributed shared memory instead of global partials, a fence and an arrival
  // counter. On an H200 (Qwen3-30B-A3B, graph, ctx 1024: 16 splits): batch 1 2.489-2.491 vs
  // 2.546-2.557 ms a step, batch 8 (8 splits) 8.481 vs 8.288. Batches 2-4 (session 27, with the
  // cap below, 4 vs 1): ctx 1024 3.702 vs 3.788 ms (batch 2), 4.688 vs 5.010 (3), 5.711 vs 5.789
  // (4); ctx 2048 3.774 vs 3.795, 4.805 vs 5.211, 5.890 vs 5.934. Batches 5-8 (session 28, 8 vs
  // 4, the engine: `bench serve --in-process`, 1024 in / 128 out, graphs of every batch size,
  // ITL p50 over two rounds): concurrency 7 7.834 vs 7.990 ms, 8 8.472 vs 8.658, 5 and 6 the same
  // (6.568 vs 6.566, 7.203-7.210 vs 7.220-7.222). `bench decode`'s exact plans had batch 5
  // slower (ctx 2048 6.725 vs 6.620; batch 8 8.365 vs 8.470 at 1024, 8.78 vs 8.84 at 2048),
  // but the engine plans on the context bucket. COROLLA_ATTN_DECODE_CLUSTER_MERGE.
  int attention_decode_cluster_merge_seqs = 8;
  // Such a batch also caps its splits at a cluster's 16 (more keys a split) while its
  // max_seq_len hint is at most this many keys, where more splits would merge wide; and it does
  // not fold its prologue in there (attention_fused_prologue_min_keys): the fold lost beside the
  // cluster at every context. On an H200 (Qwen3-30B-A3B, batch 1, graph, session 26, two
  // rounds, capped and apart vs wide and folded from 2048): ctx 1152 2.392-2.398 vs 2.499-2.509
  // ms a step, 1536 2.381-2.386 vs 2.492-2.499, 2048 2.393-2.396 vs 2.489-2.490 (capped but folded
  // 2.527-2.528), 3072 2.468-2.470 vs 2.509-2.510, 4096 2.548-2.549 vs 2.525-2.527, 8192
  // 2.883-2.890 vs 2.651-2.657. 0: the cap never applies. COROLLA_ATTN_DECODE_CLUSTER_MAX_KEYS.
  int attention_decode_cluster_max_keys = 3072;
  // That cluster merge runs once dry (no store) at the kernel's entry, before the early loads, so
  // that its code is in the instruction cache when the real merge runs (a second, warm run of
  // the merge took 2.33 us against 3.48). Off: the dry run delays the early loads and the wait
  // (on an H200, Qwen3-30B-A3B batch 1 ctx 1024, graph: 2.470 / 2.473 ms vs 2.401 / 2.396).
  // The kernel body sits in the loop that allows it either way, and that build runs the cluster
  // path faster than the one before it (2.396-2.401 vs 2.456-2.461 ms at ctx 1024 over three
  // runs in two calls; 8k, batch 8 and 64 unchanged: notes/decode_sessions.md, Session 11; its
  // SASS keeps the index arithmetic on the uniform datapath: Session 12).
  // COROLLA_ATTN_DECODE_WARM_MERGE.
  bool attention_decode_warm_merge = false;
  // The cluster merge's last barrier (it keeps each CTA's partials alive until its peers have
  // read them) arrives relaxed instead of with release semantics: the arrival then does not
  // wait for the CTA's output stores, which under the o projection's copies took ~1 us. On an
  // H100 (Qwen3-30B-A3B, graph, session 44, two runs each in one call): batch 1 2.810 / 2.809
  // vs 2.826 / 2.826 ms at ctx 1024 (the barrier 0.27 vs 0.74 us in the eager timeline), 3.210
  // / 3.211 vs 3.210 at 8192; on another H100 batch 1 / 2 / 4 at 1k 2.863 / 4.198 / 6.342 vs
  // 2.886 / 4.207 / 6.353 (8k: a tie at 1-2, 7.688 vs 7.710 at 4). Off: the cluster barrier
  // (release / acquire).
  // COROLLA_ATTN_DECODE_RELAXED_EXIT.
  bool attention_decode_relaxed_exit = true;
  // The counter merge of the split-KV partials (more splits than a cluster, or batches past
  // attention_decode_cluster_merge_seqs) done by every split instead of the last to arrive:
  // each counts itself in, waits for all (a spin: only where the whole grid fits the device at
  // once, LaunchDecode), then merges its share of the items (attention_decode.cuh,
  // WideMergeDecode). The last CTA's merge of Qwen3-30B-A3B's 32 splits at ctx 8192 read them in
  // eight L2 round trips (~9.7 us of the kernel's 17.4, session 11). On an H200 (batch 1, graph,
  // session 16, same call) 2.829 vs 2.939-2.949 ms a step at ctx 8192; ctx 1024 (the cluster
  // merge) 2.328-2.331 vs 2.325-2.334; batch 8 at 8192 (288 CTAs: more than fit at once, so the
  // last-CTA merge) 11.003 vs 11.001. COROLLA_ATTN_DECODE_WIDE_MERGE=0 turns it off.
  bool attention_decode_wide_merge = true;
  // That kernel loads its first two passes of cached keys (all but this step's, which the
  // prologue writes) before its dependency wait: earlier forwards wrote them, so they stream in
  // while the kernels before it finish (groups <= 8, D <= 128: registers). On an H200
  // (Qwen3-30B-A3B, batch 1, graph) 2.759 vs 2.781 ms at ctx 1024, 3.157 vs 3.190 at 8192.
  // COROLLA_ATTN_DECODE_PREFETCH sets it.
  bool attention_decode_prefetch = true;
  // Backend::QkNormRopeAttention folds the prologue (QK norm, RoPE, KV write) into that kernel:
  // every CTA normalises and rotates its group's q heads, the CTA whose split holds the new key
  // writes its k and v to the cache. Off: one launch fewer but no faster (same H200 run, with
  // the prefetch: 2.769 vs 2.759 ms at ctx 1024, 3.235 vs 3.157 at 8192).
  // COROLLA_ATTN_FUSED_PROLOGUE=1 turns it on.
  bool attention_fused_prologue = false;
  // With the knob above off, one sequence folds it in from this many keys (the max_seq_len hint:
  // the engine's graphs plan on their context bucket); 0: never. Where the splits merge wide
  // (more than a cluster's 16) the fold pays. On an H200 (Qwen3-30B-A3B, batch 1, graph, session
  // 17, both with the staged GEMVs at the 84% carveout), from 2048 against never: 2.481-2.484
  // vs 2.510 ms at ctx 2048, 2.513-2.517 (4096 then) vs 2.597-2.598 at 4096, 2.641-2.645
  // vs 2.735-2.737 at 8192 (call 4); 1k keeps the separate prologue (folded there: 2.439-2.441
  // vs 2.307-2.309 in call 3). Batch 8 at 8192 loses with it (11.09-11.10 vs 10.96): more sequences
  // keep it separate. Since session 26 a batch whose splits are capped to one cluster
  // (attention_decode_cluster_max_keys, up to 3072 keys) keeps it apart, so one sequence folds it
  // in from 3073 keys. COROLLA_ATTN_FUSED_PROLOGUE_MIN_KEYS.
  int attention_fused_prologue_min_keys = 2048;
  // ... in decode batches of at most this many sequences. Two pay, three do not (H200, session
  // 18, calls 2-3, ms a step at ctx 2048 / 4096 / 8192, folded vs apart): batch 2 3.794 /
  // 3.902-3.907 / 4.268-4.271 vs 3.904-3.907 / 4.028-4.033 / 4.373-4.376; batch 3 5.218-5.219 /
  // 5.415-5.417 / 5.774-5.782 vs 5.160-5.170 / 5.349-5.365 / 5.662-5.677; batch 4 at 8192
  // 7.162-7.165 vs 6.995-7.007. COROLLA_ATTN_FUSED_PROLOGUE_MAX_SEQS.
  int attention_fused_prologue_max_seqs = 2;
  // Backend::QkNormRopeAttentionProj of one token runs the prologue, the decode attention and the
  // o projection as one launch (attention_decode.cuh, DecodeOutProj; group <= 8, the splits
  // merged as a cluster or by the merge counters): CTAs past the attention's hold o_proj's rows
  // too, and all multiply once the attention's CTAs have counted themselves in, instead of
  // three kernels with two dependency releases. Correct (CudaKernelTest.QkNormRopeAttentionProj,
  // golden logits and decode graphs with it on, session 14) but slower: its ~150 KB CTAs enter
  // only as the staged qkv GEMV's leave, so its wait returns late and o_proj's bytes come after
  // it (figures below; notes/decode_sessions.md, Session 14). COROLLA_ATTN_REGION=1 sets it.
  bool attention_region = false;
  // Its CTAs start their rows' copies after the dependency wait instead of before it: the copies
  // at entry (16.8 MB, issued as the qkv GEMV leaves, since the region's ~150 KB CTAs cannot sit
  // beside its 161 KB ones) held the wait's return 7.7 us after qkv's exit (session 14); after
  // the wait they land during the attention. Slower still: on an H200 (Qwen3-30B-A3B, batch 1,
  // graph, session 14) 2.754-2.756 ms vs the separate launches' 2.445-2.454 at ctx 1024, 3.119-
  // 3.120 vs 2.922-2.931 at 8192 (the region alone, copies at entry: 2.780-2.790 vs 2.411-2.420 in
  // another call). COROLLA_ATTN_REGION_LATE_COPY=1.
  bool attention_region_late_copy = false;
  // Backend::DecodeMoeStack runs the persistent decode kernel (decode_stack.cu: every layer of a
  // Qwen3-MoE batch-1 decode step in one launch) where it covers the model; off: the caller's
  // op-by-op path. Off by default: on an H200 (Qwen3-30B-A3B, batch 1, ctx 1024, graph) it takes
  // 3.53 ms a step against 2.88 for the ops (notes/decode_step.md "Persistent decode kernel").
  // COROLLA_DECODE_STACK=1 turns it on.
  bool decode_stack = false;
  // Its attention: at least this many cached keys per (KV head, split) task. Fewer keys mean
  // more CTAs share a head's keys but more partials for the last one to merge (32: 3.67 ms, 64:
  // 3.67, 128: 3.84 at ctx 1024). COROLLA_DECODE_STACK_SPLIT_KEYS sets it.
  int decode_stack_split_keys = 64;
  // Its weight stream: 12 shared-memory stages of 16 KB, this many for ring A (the stream known
  // before the step: qkv, keys, o, router rows) and the rest for ring B (the routed experts);
  // rings of fewer than 8 stages share each stage between warps. 3 / 4 / 5 / 6 gave 3.75 / 3.57
  // / 3.63 / 3.68 ms (session 6). COROLLA_DECODE_STACK_STAGES_A sets it.
  int decode_stack_stages_a = 4;
  // Ring A holds the CTA's qkv rows (as many as its stages take) and o rows, refilled as they
  // are multiplied, so neither GEMV waits for HBM; ring B carries the other qkv rows, the keys
  // and the router rows ahead of the experts. Session 30 (stages_a 8 with it): slower, 4.01-4.10
  // against 3.51-3.53 ms, the resident rows' dot products still take ~5 us (notes/decode_step.md
  // "Persistent decode kernel", session 30). COROLLA_DECODE_STACK_RESIDENT=1 turns it on.
  bool decode_stack_resident = false;
  // Its attention tasks wait for the CTAs that wrote their KV head's q, k and v rows (a counter
  // per head) instead of a grid barrier after the qkv rows. COROLLA_DECODE_STACK_HEAD_WAIT=0
  // restores the barrier.
  bool decode_stack_head_wait = true;
  // Sampling: a step whose sampled rows all name a top_k <= 256 keeps each row's first K entries
  // of the sampling order through chunked in-block sorts (sampling_order.cuh, TopKSelectKernel)
  // instead of sorting the whole vocabulary. On an H200 (Qwen3-30B-A3B, `bench serve --in-process`,
  // 1024 in / 256 out, temperature 0.6, top_k 20, top_p 0.95: Qwen3's generation_config, session
  // 28) the ITL at concurrency 1 was 2.402 ms against 3.289 with the segmented sort of that
  // session's start (greedy 2.382); at concurrency 32 the p50 16.99 against 17.98 (greedy
  // 16.81). The device-wide sort that replaced it costs ~0.11 ms a step at concurrency 1 over
  // greedy (top_p 0.9 alone: 2.500 vs 2.389), the selection ~0.03. COROLLA_SAMPLE_TOPK_SELECT=0
  // sorts always.
  bool sample_top_k_select = true;
  // Sampling: a step whose sampled rows name no top_k (top-p, min-p, temperature alone) finds
  // the kept set's end and the draw through a histogram of the weights and sorts only the
  // entries of the bins that hold them (sampling_nucleus.cuh) instead of the whole vocabulary.
  // On an H200 (Qwen3-30B-A3B, `bench serve --in-process`, temperature 0.7 top_p 0.9, session 34)
  // the ITL at concurrency 1 was 2.47 ms against 2.55 with the sort (greedy 2.43), the p50 at 64
  // 18.94 against 19.58 (greedy 18.80). COROLLA_SAMPLE_NUCLEUS=0 sorts always.
  bool sample_nucleus = true;
  // The nucleus path in one cooperative launch when every CTA of the step fits on the device at
  // once (a few rows; 3 of Qwen3's vocabulary on an H200): the slices' bests, the histogram, the
  // plan (each CTA its own copy), the gather and the sort meet at counters a row instead of five
  // kernel boundaries (sampling_nucleus_fused.cuh). On an H200 (session 35, batch 1, top_p 0.9)
  // 28.0 us against 33.3 for the five kernels (ncu), and the engine's ITL at concurrency 1
  // 2.4297 ms against 2.4360 (greedy 2.3943). COROLLA_SAMPLE_NUCLEUS_FUSED=0 launches the
  // kernels one by one.
  bool sample_nucleus_fused = true;
  // Rows that name a top_k take the nucleus path too (sampling_nucleus.cuh: for top_k <= the
  // row's argmax slices the entries at or above the K-th largest slice best, else the bins
  // through the one where the count reaches top_k), and so do steps mixing rows with and without
  // a top_k, instead of the top-k selection or the full sort. On an H200 (session 36, Qwen3's
  // T 0.6 top_k 20 top_p 0.95) one call at batch 64 took 80-83 us against 230 for the selection,
  // at batch 1 18.2 us of GPU time against 28.9 (ncu); the engine's ITL p50 at concurrency 64
  // 18.88 against 19.01 ms (greedy 18.82), at concurrency 1 within the calls' spread of it (2.414
  // against 2.407 in one call, 2.419 against 2.421 in another). COROLLA_SAMPLE_TOPK_HIST=0 keeps
  // the selection.
  bool sample_top_k_hist = true;
  // A nucleus row whose candidates are at most one a thread (a top-k row's ~50 entries at or
  // above its bound, a peaked row's runs) is sorted by ranks: each thread counts the candidates
  // below its own in shared memory and stores it at that place (the keys are distinct: the id is
  // in their low bits), no radix passes and no tie search (sampling_nucleus_pick.cuh,
  // SampleRanked): a fraction of the radix sort's code, which the engine's step fetches cold
  // after the decode graph's kernels. On an H100 (session 37, Qwen3's T 0.6 top_k 20 top_p 0.95
  // at concurrency 1) the fused kernel ran 16.0 us inside the engine against 24.5 with the radix
  // sort (its sort 1.5 against 8.5) and the ITL was 2.953 against 2.963 ms (greedy 2.936).
  // COROLLA_SAMPLE_RANKED=0 sorts them on the radix sort's path.
  bool sample_ranked = true;
};
KernelTuning& Tuning();

}  // namespace corolla::cuda
