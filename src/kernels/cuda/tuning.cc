// Tuning(): the kernel choices' defaults (tuning.h), each overridable once per process by its
// COROLLA_* environment variable.
#include "kernels/cuda/tuning.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace corolla::cuda {
namespace {

// A knob's variable, where set, read as the field's type (a bool: nonzero).
void Env(const char* name, bool& field) {
  if (const char* v = std::getenv(name)) field = std::atoi(v) != 0;
}
void Env(const char* name, int& field) {
  if (const char* v = std::getenv(name)) field = std::atoi(v);
}
void Env(const char* name, int64_t& field) {
  if (const char* v = std::getenv(name)) field = std::atoll(v);
}

}  // namespace

KernelTuning& Tuning() {
  static KernelTuning tuning = [] {
    KernelTuning t;
    Env("COROLLA_MOE_PAIR_GEMV_MAX_PAIRS", t.moe_pair_gemv_max_pairs);
    Env("COROLLA_MOE_SKINNY_MAX_PAIRS", t.moe_skinny_max_pairs);
    Env("COROLLA_LINEAR_GEMV_MAX_ROWS", t.linear_gemv_max_rows);
    Env("COROLLA_LINEAR_MMA_MAX_ROWS", t.linear_mma_max_rows);
    Env("COROLLA_ATTN_SPLIT_MIN_CTAS", t.attention_split_min_ctas);
    Env("COROLLA_ATTN_DECODE_ONE_WAVE", t.attention_decode_one_wave);
    Env("COROLLA_ATTN_DECODE_CLUSTER_MIN_CTAS", t.attention_decode_cluster_min_ctas);
    Env("COROLLA_ATTN_MMA", t.attention_mma);
    Env("COROLLA_GDN_CHUNKED_MIN_TOKENS", t.gated_delta_chunked_min_tokens);
    Env("COROLLA_MLA_DECODE_SPLITS", t.mla_decode_splits);
    Env("COROLLA_ATTN_FUSED_MERGE", t.attention_fused_merge);
    Env("COROLLA_PDL", t.pdl);
    Env("COROLLA_FUSED_ROUTER_MAX_TOKENS", t.fused_router_max_tokens);
    Env("COROLLA_MOE_PAIR_DOWN_SLOTS", t.moe_pair_down_slots);
    Env("COROLLA_MOE_GEMM_WGMMA", t.moe_gemm_wgmma);
    Env("COROLLA_MOE_GEMM_WGMMA_TILE64", t.moe_gemm_wgmma_tile64);
    Env("COROLLA_MOE_WGMMA_SKIP_IDLE", t.moe_gemm_wgmma_skip_idle);
    Env("COROLLA_MOE_GEMM_SNAKE", t.moe_gemm_snake);
    Env("COROLLA_MOE_PERMUTE_ONE_CTA_MAX_PAIRS", t.moe_permute_one_cta_max_pairs);
    Env("COROLLA_MOE_GEMM_TILE_ROWS", t.moe_gemm_tile_rows);
    Env("COROLLA_MOE_COMBINE_VEC", t.moe_combine_vec);
    Env("COROLLA_MOE_Y_BF16", t.moe_y_bf16);
    Env("COROLLA_ATTN_WGMMA", t.attention_wgmma);
    Env("COROLLA_LINEAR_FP8_GEMV_MAX_ROWS", t.linear_fp8_gemv_max_rows);
    Env("COROLLA_MOE_FP8_WGMMA", t.moe_fp8_wgmma);
    Env("COROLLA_MOE_FP8_WGMMA_TILE_N", t.moe_fp8_wgmma_tile_n);
    Env("COROLLA_ATTN_WGMMA_VARIANT", t.attention_wgmma_variant);
    Env("COROLLA_ATTN_TMA", t.attention_wgmma_tma);
    Env("COROLLA_ATTN_WGMMA_HEADS_FASTEST", t.attention_wgmma_heads_fastest);
    Env("COROLLA_ATTN_MIXED_DECODE", t.attention_mixed_decode);
    Env("COROLLA_PDL_CARVEOUT", t.pdl_carveout);
    Env("COROLLA_GEMV_STAGED_CARVEOUT", t.gemv_staged_carveout);
    Env("COROLLA_GEMV_STAGED_CARVEOUT_FOLDED", t.gemv_staged_carveout_folded);
    Env("COROLLA_ATTN_DECODE_CARVEOUT", t.attention_decode_carveout);
    Env("COROLLA_GEMV_STAGED_SPREAD_NS", t.gemv_staged_spread_ns);
    Env("COROLLA_GEMV_STAGED_DEPTH", t.gemv_staged_depth);
    Env("COROLLA_GEMV_STAGED_DEPTH_NORM", t.gemv_staged_depth_norm);
    Env("COROLLA_GEMV_ONE_WAVE", t.gemv_one_wave);
    Env("COROLLA_GEMV_STAGED", t.gemv_staged);
    Env("COROLLA_PDL_EARLY_TRIGGER", t.pdl_early_trigger);
    if (const char* v = std::getenv("COROLLA_ATTN_DECODE_TRIGGER"))
      t.attention_decode_trigger = std::clamp(std::atoi(v), 0, 2);
    Env("COROLLA_RMSNORM_EARLY_TRIGGER", t.rmsnorm_early_trigger);
    Env("COROLLA_PROLOGUE_EARLY_TRIGGER", t.prologue_early_trigger);
    Env("COROLLA_PROLOGUE_EARLY_LOADS", t.prologue_early_loads);
    Env("COROLLA_PROLOGUE_WARP_PER_TOKEN", t.prologue_warp_per_token);
    Env("COROLLA_PROLOGUE_WARP_PER_TOKEN_MIN_TOKENS", t.prologue_warp_per_token_min_tokens);
    Env("COROLLA_MOE_PAIR_GATE_UP_ROWS", t.moe_pair_gate_up_rows);
    Env("COROLLA_MOE_PAIR_DOWN_ROWS", t.moe_pair_down_rows);
    Env("COROLLA_MOE_PAIR_GATE_UP_ONE_WAVE", t.moe_pair_gate_up_one_wave);
    Env("COROLLA_MOE_PREFETCH_PREVIOUS", t.moe_prefetch_previous);
    Env("COROLLA_MOE_PREDICT", t.moe_predict);
    Env("COROLLA_MOE_PREFETCH_QKV", t.moe_prefetch_qkv);
    Env("COROLLA_MOE_PREFETCH_QKV_DOWN", t.moe_prefetch_qkv_down);
    Env("COROLLA_MOE_PREFETCH_QKV_LAST", t.moe_prefetch_qkv_last);
    Env("COROLLA_MOE_PREFETCH_QKV_PREDICT", t.moe_prefetch_qkv_predict);
    Env("COROLLA_MOE_RESIDUAL_FOLD", t.moe_residual_fold);
    Env("COROLLA_STAGED_ROUTER", t.staged_router);
    Env("COROLLA_STAGED_ROUTER_NORM", t.staged_router_norm);
    Env("COROLLA_CLUSTER_NORM_ROUTER", t.cluster_norm_router);
    Env("COROLLA_CLUSTER_NORM_ROUTER_MAX_TOKENS", t.cluster_norm_router_max_tokens);
    Env("COROLLA_CLUSTER_NORM_ROUTER_REGS", t.cluster_norm_router_regs);
    Env("COROLLA_CLUSTER_NORM_ROUTER_ASYNC", t.cluster_norm_router_async);
    Env("COROLLA_ROUTE_BY_LOGITS", t.route_by_logits);
    Env("COROLLA_GEMV_STAGED_NORM", t.gemv_staged_norm);
    Env("COROLLA_ATTN_DECODE", t.attention_decode_kernel);
    Env("COROLLA_ATTN_DECODE_SPLIT_KEYS", t.attention_decode_split_keys);
    Env("COROLLA_ATTN_DECODE_MERGE_FLOATS", t.attention_decode_merge_floats);
    Env("COROLLA_ATTN_DECODE_CLUSTER_MERGE", t.attention_decode_cluster_merge_seqs);
    Env("COROLLA_ATTN_DECODE_CLUSTER_MAX_KEYS", t.attention_decode_cluster_max_keys);
    Env("COROLLA_ATTN_DECODE_WARM_MERGE", t.attention_decode_warm_merge);
    Env("COROLLA_ATTN_DECODE_RELAXED_EXIT", t.attention_decode_relaxed_exit);
    Env("COROLLA_ATTN_DECODE_WIDE_MERGE", t.attention_decode_wide_merge);
    Env("COROLLA_ATTN_DECODE_PREFETCH", t.attention_decode_prefetch);
    Env("COROLLA_ATTN_FUSED_PROLOGUE", t.attention_fused_prologue);
    Env("COROLLA_ATTN_FUSED_PROLOGUE_MIN_KEYS", t.attention_fused_prologue_min_keys);
    Env("COROLLA_ATTN_FUSED_PROLOGUE_MAX_SEQS", t.attention_fused_prologue_max_seqs);
    Env("COROLLA_ATTN_REGION", t.attention_region);
    Env("COROLLA_ATTN_REGION_LATE_COPY", t.attention_region_late_copy);
    Env("COROLLA_DECODE_STACK", t.decode_stack);
    Env("COROLLA_DECODE_STACK_SPLIT_KEYS", t.decode_stack_split_keys);
    Env("COROLLA_DECODE_STACK_STAGES_A", t.decode_stack_stages_a);
    Env("COROLLA_DECODE_STACK_HEAD_WAIT", t.decode_stack_head_wait);
    Env("COROLLA_DECODE_STACK_RESIDENT", t.decode_stack_resident);
    Env("COROLLA_SAMPLE_TOPK_SELECT", t.sample_top_k_select);
    Env("COROLLA_SAMPLE_NUCLEUS", t.sample_nucleus);
    Env("COROLLA_SAMPLE_NUCLEUS_FUSED", t.sample_nucleus_fused);
    Env("COROLLA_SAMPLE_TOPK_HIST", t.sample_top_k_hist);
    Env("COROLLA_SAMPLE_RANKED", t.sample_ranked);
    return t;
  }();
  return tuning;
}

}  // namespace corolla::cuda
