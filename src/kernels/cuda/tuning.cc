// Tuning(): the kernel choices' defaults (tuning.h), each overridable once per process by its
// COROLLA_* environment variable.
#include "kernels/cuda/tuning.h"

#include <algorithm>
#include <cstdlib>

namespace corolla::cuda {

KernelTuning& Tuning() {
  static KernelTuning tuning = [] {
    KernelTuning t;
    if (const char* v = std::getenv("COROLLA_MOE_DECODE_MAX_PAIRS")) t.moe_decode_max_pairs = std::atoll(v);
    if (const char* v = std::getenv("COROLLA_MOE_PAIR_GEMV_MAX_PAIRS")) t.moe_pair_gemv_max_pairs = std::atoll(v);
    if (const char* v = std::getenv("COROLLA_LINEAR_GEMV_MAX_ROWS")) t.linear_gemv_max_rows = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_LINEAR_MMA_MAX_ROWS"))
      t.linear_mma_max_rows = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_ATTN_SPLIT_MIN_CTAS")) t.attention_split_min_ctas = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_ATTN_DECODE_ONE_WAVE"))
      t.attention_decode_one_wave = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_ATTN_DECODE_CLUSTER_MIN_CTAS"))
      t.attention_decode_cluster_min_ctas = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_ATTN_MMA")) t.attention_mma = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_GDN_CHUNKED_MIN_TOKENS")) t.gated_delta_chunked_min_tokens = std::atoll(v);
    if (const char* v = std::getenv("COROLLA_MLA_DECODE_SPLITS")) t.mla_decode_splits = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_ATTN_FUSED_MERGE")) t.attention_fused_merge = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_PDL")) t.pdl = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_FUSED_ROUTER_MAX_TOKENS")) t.fused_router_max_tokens = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_MOE_PAIR_DOWN_SLOTS")) t.moe_pair_down_slots = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_MOE_GEMM_WGMMA")) t.moe_gemm_wgmma = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_MOE_GEMM_WGMMA_TILE64")) t.moe_gemm_wgmma_tile64 = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_MOE_WGMMA_SKIP_IDLE"))
      t.moe_gemm_wgmma_skip_idle = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_MOE_GEMM_SNAKE")) t.moe_gemm_snake = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_MOE_PERMUTE_ONE_CTA_MAX_PAIRS"))
      t.moe_permute_one_cta_max_pairs = std::atoll(v);
    if (const char* v = std::getenv("COROLLA_MOE_GEMM_TILE_ROWS")) t.moe_gemm_tile_rows = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_MOE_COMBINE_VEC")) t.moe_combine_vec = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_MOE_Y_BF16")) t.moe_y_bf16 = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_ATTN_WGMMA")) t.attention_wgmma = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_LINEAR_FP8_GEMV_MAX_ROWS")) t.linear_fp8_gemv_max_rows = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_MOE_FP8_WGMMA")) t.moe_fp8_wgmma = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_MOE_FP8_WGMMA_TILE_N")) t.moe_fp8_wgmma_tile_n = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_ATTN_WGMMA_VARIANT")) t.attention_wgmma_variant = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_ATTN_TMA")) t.attention_wgmma_tma = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_ATTN_WGMMA_HEADS_FASTEST"))
      t.attention_wgmma_heads_fastest = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_ATTN_MIXED_DECODE"))
      t.attention_mixed_decode = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_PDL_CARVEOUT")) t.pdl_carveout = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_GEMV_STAGED_CARVEOUT")) t.gemv_staged_carveout = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_GEMV_STAGED_CARVEOUT_FOLDED")) t.gemv_staged_carveout_folded = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_ATTN_DECODE_CARVEOUT")) t.attention_decode_carveout = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_GEMV_STAGED_SPREAD_NS")) t.gemv_staged_spread_ns = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_GEMV_STAGED_DEPTH")) t.gemv_staged_depth = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_GEMV_STAGED_DEPTH_NORM")) t.gemv_staged_depth_norm = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_GEMV_ONE_WAVE")) t.gemv_one_wave = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_GEMV_STAGED")) t.gemv_staged = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_PDL_EARLY_TRIGGER")) t.pdl_early_trigger = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_ATTN_DECODE_TRIGGER"))
      t.attention_decode_trigger = std::clamp(std::atoi(v), 0, 2);
    if (const char* v = std::getenv("COROLLA_RMSNORM_EARLY_TRIGGER")) t.rmsnorm_early_trigger = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_PROLOGUE_EARLY_TRIGGER")) t.prologue_early_trigger = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_PROLOGUE_EARLY_LOADS")) t.prologue_early_loads = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_PROLOGUE_WARP_PER_TOKEN")) t.prologue_warp_per_token = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_PROLOGUE_WARP_PER_TOKEN_MIN_TOKENS"))
      t.prologue_warp_per_token_min_tokens = std::atoll(v);
    if (const char* v = std::getenv("COROLLA_MOE_PAIR_GATE_UP_ROWS")) t.moe_pair_gate_up_rows = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_MOE_PAIR_DOWN_ROWS")) t.moe_pair_down_rows = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_MOE_PAIR_GATE_UP_ONE_WAVE"))
      t.moe_pair_gate_up_one_wave = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_MOE_RESIDUAL_FOLD")) t.moe_residual_fold = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_NORM_LINEAR_AHEAD")) t.norm_linear_ahead = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_LINEAR_AHEAD")) t.linear_ahead = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_AHEAD_AWAIT_EARLY_TRIGGER"))
      t.ahead_await_early_trigger = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_AHEAD_GO_FROM_MOE")) t.ahead_go_from_moe = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_AHEAD_GLOBAL_WARPS"))
      t.ahead_global_warps = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_AHEAD_WARPS")) t.ahead_warps = std::atoi(v) == 8 ? 8 : 4;
    if (const char* v = std::getenv("COROLLA_AHEAD_CARVEOUT")) t.ahead_carveout = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_STAGED_ROUTER")) t.staged_router = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_STAGED_ROUTER_NORM")) t.staged_router_norm = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_CLUSTER_NORM_ROUTER")) t.cluster_norm_router = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_CLUSTER_NORM_ROUTER_MAX_TOKENS"))
      t.cluster_norm_router_max_tokens = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_CLUSTER_NORM_ROUTER_REGS"))
      t.cluster_norm_router_regs = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_GEMV_STAGED_NORM")) t.gemv_staged_norm = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_ATTN_DECODE")) t.attention_decode_kernel = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_ATTN_DECODE_SPLIT_KEYS")) t.attention_decode_split_keys = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_ATTN_DECODE_MERGE_FLOATS")) t.attention_decode_merge_floats = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_ATTN_DECODE_CLUSTER_MERGE"))
      t.attention_decode_cluster_merge_seqs = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_ATTN_DECODE_CLUSTER_MAX_KEYS"))
      t.attention_decode_cluster_max_keys = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_ATTN_DECODE_WARM_MERGE")) t.attention_decode_warm_merge = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_ATTN_DECODE_RELAXED_EXIT"))
      t.attention_decode_relaxed_exit = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_ATTN_DECODE_WIDE_MERGE"))
      t.attention_decode_wide_merge = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_ATTN_DECODE_PREFETCH")) t.attention_decode_prefetch = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_ATTN_FUSED_PROLOGUE")) t.attention_fused_prologue = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_ATTN_FUSED_PROLOGUE_MIN_KEYS"))
      t.attention_fused_prologue_min_keys = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_ATTN_FUSED_PROLOGUE_MAX_SEQS"))
      t.attention_fused_prologue_max_seqs = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_ATTN_REGION")) t.attention_region = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_ATTN_REGION_LATE_COPY")) t.attention_region_late_copy = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_DECODE_STACK")) t.decode_stack = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_DECODE_STACK_SPLIT_KEYS")) t.decode_stack_split_keys = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_DECODE_STACK_STAGES_A")) t.decode_stack_stages_a = std::atoi(v);
    if (const char* v = std::getenv("COROLLA_DECODE_STACK_HEAD_WAIT"))
      t.decode_stack_head_wait = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_DECODE_STACK_RESIDENT"))
      t.decode_stack_resident = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_SAMPLE_TOPK_SELECT"))
      t.sample_top_k_select = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_SAMPLE_NUCLEUS")) t.sample_nucleus = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_SAMPLE_NUCLEUS_FUSED"))
      t.sample_nucleus_fused = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_SAMPLE_TOPK_HIST"))
      t.sample_top_k_hist = std::atoi(v) != 0;
    if (const char* v = std::getenv("COROLLA_SAMPLE_RANKED")) t.sample_ranked = std::atoi(v) != 0;
    return t;
  }();
  return tuning;
}

}  // namespace corolla::cuda
