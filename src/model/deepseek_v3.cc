#include "model/deepseek_v3.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/logging.h"
#include "model/residual_stream.h"
#include "model/weights.h"
#include "parallel/communicator.h"
#include "parallel/expert_parallel.h"

namespace corolla {
namespace {

// Hl: this rank's heads (all Hq on one rank). The latent projections (q_a, kv_a and their
// norms) are whole on every rank: every head reads the same latent.
struct MlaWeights {
  LinearWeight in_proj;  // [q_in + kv_lora + rope, H]: (q_a_proj | q_proj rows of the Hl heads) then kv_a_proj_with_mqa
  Tensor q_a_norm;    // [q_lora] (with a query bottleneck)
  LinearWeight q_b;   // [Hl * qk_head, q_lora]: rows of the Hl heads
  Tensor kv_a_norm;   // [kv_lora]
  Tensor kv_b;        // [Hl * (nope + v), kv_lora]: decompression of the latent, rows of the Hl heads
  Tensor uk_t;        // [Hl, kv_lora, nope]: W_UK^T per head, absorbed into the query
  Tensor uv;          // [Hl, v, kv_lora]: W_UV per head, applied after attention
  LinearWeight o;     // [H, Hl * v]: columns of the Hl heads (row-parallel, partial sums)
};

struct FfnWeights {     // SwiGLU: dense layers and shared experts; Il = I / tp
  LinearWeight gate_up;  // [2 Il, H]: this rank's gate rows, then its up rows
  LinearWeight down;     // [H, Il]: the matching columns (row-parallel, partial sums)
};

struct LayerWeights {
  Tensor input_norm, post_attention_norm;
  MlaWeights attn;
  bool is_moe = false;
  FfnWeights dense;     // when !is_moe
  Tensor router;        // [E, H] (every rank routes every token)
  Tensor router_bias;   // [E] f32 (e_score_correction_bias)
  Tensor experts_gate_up, experts_down;  // [El, 2I, H], [El, H, I]: this rank's experts (bf16)
  ExpertsFp8 experts_fp8;                // or the same kept FP8 (native FP8 on a backend that takes them)
  FfnWeights shared;    // when num_shared_experts > 0
};

// One multi-token-prediction module: the next token's embedding and the main model's last
// hidden state, each normed, joined by eh_proj, through one more decoder layer.
struct MtpWeights {
  Tensor enorm, hnorm;  // [H]
  Tensor eh_proj;       // [H, 2H]
  Tensor head_norm;     // [H] before the shared LM head
  LayerWeights layer;
};

class DeepseekV3Model final : public Model {
 public:
  DeepseekV3Model(ModelConfig config, Backend& backend, const ModelShard& shard)
      : config_(std::move(config)), backend_(backend), shard_(shard) {}

  Status Load(const Checkpoint& checkpoint);
  void set_mode(MlaMode mode) { mode_ = mode; }
  int num_mtp_modules() const { return static_cast<int>(mtp_.size()); }

  const ModelConfig& config() const override { return config_; }
  // One latent per token: all heads read it, so under TP every rank holds the same whole cache.
  KvCacheSpec kv_cache_spec() const override {
    return {config_.num_layers, 1, config_.mla.kv_lora_rank + config_.mla.qk_rope_head_dim, true};
  }
  void Forward(const ForwardBatch& batch, std::span<const KvCacheView> kv_caches,
               const TensorView& logits) override;

 private:
  // Splits heads, MLP columns and experts over the shard's ranks (all of them for one rank).
  Status PlanShard();
  Status LoadFfn(WeightLoader& w, const std::string& prefix, int64_t inter, FfnWeights* out);
  Status LoadLayer(WeightLoader& w, const std::string& prefix, bool is_moe, LayerWeights* out);
  void Ffn(const FfnWeights& f, const TensorView& x, const TensorView& out);
  void Attention(int layer, const TensorView& x, const ForwardBatch& batch, const KvCacheView& cache,
                 bool absorbed, const TensorView& out);
  void AbsorbedAttention(const MlaWeights& w, const TensorView& q, const ForwardBatch& batch,
                         const KvCacheView& cache, const TensorView& out);
  void DecompressedAttention(const MlaWeights& w, const TensorView& q, const ForwardBatch& batch,
                             const KvCacheView& cache, const TensorView& out);
  void Moe(const LayerWeights& lw, const TensorView& x, const TensorView& out);
  // MoeExperts over this rank's experts (local ids in topk_ids), bf16 or FP8 as they were loaded.
  void RoutedExperts(const LayerWeights& lw, const TensorView& x, const TensorView& topk_ids,
                     const TensorView& topk_weights, const TensorView& out);
  // DP-EP: this rank's tokens x [T, H] go to the ranks of their experts (topk_ids global) and
  // their routed outputs come back summed into out [T, H]; T may be 0.
  void ExpertsOverRanks(const LayerWeights& lw, const TensorView& x, const TensorView& topk_ids,
                        const TensorView& topk_weights, const TensorView& out);
  // DP-EP with no tokens on this rank: only every MoE layer's exchanges, with zero rows.
  void IdleStep();
  // Sums a row-parallel output over `comm`'s ranks (nothing without one).
  void AllReduce(Communicator* comm, const TensorView& x) {
    if (comm != nullptr) comm->AllReduceSum(x);
  }

  ModelConfig config_;
  Backend& backend_;
  ModelShard shard_;
  // This rank's part: heads [first_head_, + num_heads_), experts [first_expert_, + num_local_experts_).
  int num_heads_ = 0, first_head_ = 0;
  int num_local_experts_ = 0, first_expert_ = 0;
  MlaMode mode_ = MlaMode::kAuto;
  std::unique_ptr<EpExchange> ep_exchange_;  // DP-EP only
  // DecompressedAttention's host copy of the forward's AttentionBatch (the same for every
  // layer); Forward invalidates it.
  struct HostBatchMeta {
    bool valid = false;
    std::vector<int32_t> query_start, seq_lens, block_tables;
    // DecompressedAttention's per-sequence device metadata, the same in every layer: the rows of
    // its latents in the paged cache (viewed as [num_blocks * block_size, D]) and its one-block
    // cache's {0, q_len, ctx, 0} (query_start, seq_lens, table).
    struct Seq {
      Tensor cache_rows, meta;
    };
    std::vector<Seq> seqs;
  };
  HostBatchMeta host_meta_;
  RopeParams rope_;
  float attention_scale_ = 1.0f;
  Tensor embed_, lm_head_, final_norm_;
  std::vector<LayerWeights> layers_;
  std::vector<MtpWeights> mtp_;
};

// Rows [begin, begin + width) of every row of a 2-D view.
TensorView Columns(const TensorView& x, int64_t begin, int64_t width) {
  TensorView v = x;
  v.data = static_cast<char*>(x.data) + begin * DTypeSize(x.dtype);
  v.shape.dims[1] = width;
  return v;
}

// A [T, heads, width] view of x [T, heads * stride] starting at column `begin` of each head.
TensorView Heads(const TensorView& x, int64_t heads, int64_t stride, int64_t begin, int64_t width) {
  TensorView v = x;
  v.data = static_cast<char*>(x.data) + begin * DTypeSize(x.dtype);
  v.shape = {x.dim(0), heads, width};
  v.strides = {x.strides[0], stride, 1, 0};
  return v;
}

// Columns [begin, begin + width) of a one-block cache [1, heads, ctx, d] viewed token-major as
// [ctx, heads, width].
TensorView TokenMajor(const TensorView& cache, int64_t begin, int64_t width) {
  const int64_t heads = cache.dim(1), ctx = cache.dim(2), d = cache.dim(3);
  TensorView v = cache;
  v.data = static_cast<char*>(cache.data) + begin * DTypeSize(cache.dtype);
  v.shape = {ctx, heads, width};
  v.strides = {d, ctx * d, 1, 0};
  return v;
}

Status DeepseekV3Model::PlanShard() {
  const ModelConfig& c = config_;
  const int tp = shard_.tp_size;
  auto fail = [&](const std::string& why) {
    return InvalidArgument(c.model_type + " does not split over --tp " + std::to_string(tp) + " / --ep " +
                           std::to_string(shard_.ep_size) + ": " + why);
  };
  // DP-EP: each DP replica attends to its own sequences; heads, dense layers and shared experts
  // split over its TP ranks as under TP alone (whole with --tp 1); the routed experts are split
  // over all EP ranks.
  RETURN_IF_ERROR(CheckExpertLayout(shard_, c.model_type, c.num_experts > 0));
  if (tp > 1 && shard_.tp == nullptr) return Internal("--tp " + std::to_string(tp) + " without a TP communicator");
  if (c.num_attention_heads % tp != 0) return fail(std::to_string(c.num_attention_heads) + " attention heads");
  num_heads_ = c.num_attention_heads / tp;
  first_head_ = shard_.tp_rank * num_heads_;
  for (int l = 0; l < c.num_layers; ++l)
    if (!c.is_moe_layer(l) && c.intermediate_size % tp != 0)
      return fail("intermediate size " + std::to_string(c.intermediate_size));
  if (int64_t{c.moe_intermediate_size} * c.num_shared_experts % tp != 0)
    return fail("shared experts' intermediate size " + std::to_string(c.moe_intermediate_size * c.num_shared_experts));
  if (c.num_experts % shard_.ep_size != 0) return fail(std::to_string(c.num_experts) + " routed experts");
  num_local_experts_ = c.num_experts / shard_.ep_size;
  first_expert_ = shard_.ep_rank * num_local_experts_;
  if (!shard_.uses_ep_exchange()) return Status::Ok();
  if (shard_.ep_size > kMaxEpRanks) return fail("at most " + std::to_string(kMaxEpRanks) + " EP ranks");
  ASSIGN_OR_RETURN(ep_exchange_, MakeEpExchange(backend_, *shard_.ep,
                                               {c.num_experts, shard_.ep_capacity, shard_.ep_sized_fallback},
                                               c.hidden_size, c.num_experts_per_token, tp, shard_.tp_rank));
  return Status::Ok();
}

// Column-parallel gate|up (rows [r I/tp, (r+1) I/tp) of each), row-parallel down (the matching
// columns). A shard may cut an FP8 scale block; the loader dequantises with the whole tensor's.
Status DeepseekV3Model::LoadFfn(WeightLoader& w, const std::string& p, int64_t inter, FfnWeights* out) {
  const int64_t hidden = config_.hidden_size;
  const int tp = shard_.tp_size, tp_rank = shard_.tp_rank;
  const Shard rows = Shard::Part(0, inter, tp_rank, tp), cols = Shard::Part(1, inter, tp_rank, tp);
  ASSIGN_OR_RETURN(out->gate_up, w.LoadLinearConcat({p + "gate_proj.weight", p + "up_proj.weight"},
                                                    {{inter, hidden}, {inter, hidden}}, {rows, rows}));
  ASSIGN_OR_RETURN(out->down, w.LoadLinear(p + "down_proj.weight", {hidden, inter}, cols));
  return Status::Ok();
}

Status DeepseekV3Model::LoadLayer(WeightLoader& w, const std::string& p, bool is_moe, LayerWeights* out) {
  const ModelConfig& c = config_;
  const MlaConfig& m = c.mla;
  const int64_t hidden = c.hidden_size, heads = c.num_attention_heads;  // heads: all of them (the checkpoint's)
  const int64_t nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, vdim = m.v_head_dim;
  const int64_t kv_lora = m.kv_lora_rank, qk_head = m.qk_head_dim();
  const int64_t first = first_head_, local = num_heads_;  // this rank's heads
  const std::string a = p + "self_attn.";
  LayerWeights& lw = *out;
  ASSIGN_OR_RETURN(lw.input_norm, w.Load(p + "input_layernorm.weight", {hidden}));
  ASSIGN_OR_RETURN(lw.post_attention_norm, w.Load(p + "post_attention_layernorm.weight", {hidden}));
  // One projection for the query path and the latent path (q_a and kv_a share their input).
  // Query rows are per head ([nope | rope] each), so a head's rows are contiguous.
  const Shape kv_a_shape{kv_lora + rope, hidden};
  const Shard q_rows = Shard::Rows(first * qk_head, (first + local) * qk_head);
  if (m.q_lora_rank > 0) {
    ASSIGN_OR_RETURN(lw.attn.in_proj, w.LoadLinearConcat({a + "q_a_proj.weight", a + "kv_a_proj_with_mqa.weight"},
                                                         {{m.q_lora_rank, hidden}, kv_a_shape}));
    ASSIGN_OR_RETURN(lw.attn.q_a_norm, w.Load(a + "q_a_layernorm.weight", {m.q_lora_rank}));
    ASSIGN_OR_RETURN(lw.attn.q_b, w.LoadLinear(a + "q_b_proj.weight", {heads * qk_head, m.q_lora_rank}, q_rows));
  } else {
    ASSIGN_OR_RETURN(lw.attn.in_proj, w.LoadLinearConcat({a + "q_proj.weight", a + "kv_a_proj_with_mqa.weight"},
                                                         {{heads * qk_head, hidden}, kv_a_shape}, {q_rows, Shard{}}));
  }
  ASSIGN_OR_RETURN(lw.attn.kv_a_norm, w.Load(a + "kv_a_layernorm.weight", {kv_lora}));
  ASSIGN_OR_RETURN(Tensor kv_b, w.LoadHost(a + "kv_b_proj.weight", {heads * (nope + vdim), kv_lora},
                                           Shard::Rows(first * (nope + vdim), (first + local) * (nope + vdim))));
  lw.attn.kv_b = backend_.LoadWeight(kv_b);
  // Per local head h, rows [h*(nope+v), +nope) of kv_b are W_UK[h] [nope, kv_lora], the next v
  // rows W_UV[h] [v, kv_lora]; each stacked over the heads for one batched GEMM.
  Tensor uk_t = Tensor::Empty(DType::kF32, {local, kv_lora, nope});
  Tensor uv = Tensor::Empty(DType::kF32, {local, vdim, kv_lora});
  for (int64_t h = 0; h < local; ++h) {
    const float* uk = kv_b.ptr<float>() + h * (nope + vdim) * kv_lora;
    float* uk_t_h = uk_t.ptr<float>() + h * kv_lora * nope;
    for (int64_t i = 0; i < nope; ++i)
      for (int64_t j = 0; j < kv_lora; ++j) uk_t_h[j * nope + i] = uk[i * kv_lora + j];
    std::copy(uk + nope * kv_lora, uk + (nope + vdim) * kv_lora, uv.ptr<float>() + h * vdim * kv_lora);
  }
  lw.attn.uk_t = backend_.LoadWeight(uk_t);
  lw.attn.uv = backend_.LoadWeight(uv);
  ASSIGN_OR_RETURN(lw.attn.o, w.LoadLinear(a + "o_proj.weight", {hidden, heads * vdim},
                                           Shard::Cols(first * vdim, (first + local) * vdim)));

  const std::string f = p + "mlp.";
  lw.is_moe = is_moe;
  if (!lw.is_moe) return LoadFfn(w, f, c.intermediate_size, &lw.dense);
  const int e = c.num_experts, inter = c.moe_intermediate_size;
  ASSIGN_OR_RETURN(lw.router, w.Load(f + "gate.weight", {e, hidden}));
  if (w.Has(f + "gate.e_score_correction_bias")) {
    ASSIGN_OR_RETURN(Tensor bias, w.LoadHost(f + "gate.e_score_correction_bias", {e}));
    lw.router_bias = backend_.Empty(DType::kF32, {e});
    backend_.CopyFromHost(bias.view().data, lw.router_bias);
  }
  ASSIGN_OR_RETURN(const bool fp8_experts, w.LoadExpertsFp8(f + "experts.", e, inter, c.hidden_size, first_expert_,
                                                             num_local_experts_, &lw.experts_fp8));
  if (!fp8_experts) {
    ASSIGN_OR_RETURN(lw.experts_gate_up, w.LoadExpertsGateUp(f + "experts.", e, inter, c.hidden_size, first_expert_,
                                                             num_local_experts_));
    ASSIGN_OR_RETURN(lw.experts_down, w.LoadExpertsDown(f + "experts.", e, inter, c.hidden_size, first_expert_,
                                                        num_local_experts_));
  }
  if (c.num_shared_experts > 0)
    RETURN_IF_ERROR(LoadFfn(w, f + "shared_experts.", static_cast<int64_t>(inter) * c.num_shared_experts, &lw.shared));
  return Status::Ok();
}

Status DeepseekV3Model::Load(const Checkpoint& checkpoint) {
  const ModelConfig& c = config_;
  const MlaConfig& m = c.mla;
  const int64_t hidden = c.hidden_size, rope = m.qk_rope_head_dim, qk_head = m.qk_head_dim();
  RETURN_IF_ERROR(PlanShard());
  WeightLoader w(checkpoint, backend_);
  w.set_fp8_block(c.quant.block_rows, c.quant.block_cols);
  ASSIGN_OR_RETURN(const bool native_fp8, NativeFp8Requested(backend_));
  w.set_native_fp8(native_fp8);

  const std::string& root = c.weight_prefix;
  ASSIGN_OR_RETURN(embed_, w.Load(root + "embed_tokens.weight", {c.vocab_size, hidden}));
  ASSIGN_OR_RETURN(final_norm_, w.Load(root + "norm.weight", {hidden}));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    ASSIGN_OR_RETURN(lm_head_, w.Load("lm_head.weight", {c.vocab_size, hidden}));
  }

  layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l)
    RETURN_IF_ERROR(LoadLayer(w, root + "layers." + std::to_string(l) + ".", c.is_moe_layer(l), &layers_[l]));
  // Multi-token-prediction modules (model.layers.<num_hidden_layers + i>.*), kept for
  // speculative decoding, split over the ranks like the decoder layers. transformers'
  // save_pretrained drops them; published checkpoints carry them.
  for (int i = 0; i < c.num_nextn_predict_layers; ++i) {
    const std::string p = root + "layers." + std::to_string(c.num_layers + i) + ".";
    if (!w.Has(p + "eh_proj.weight")) break;
    MtpWeights& mtp = mtp_.emplace_back();
    ASSIGN_OR_RETURN(mtp.enorm, w.Load(p + "enorm.weight", {hidden}));
    ASSIGN_OR_RETURN(mtp.hnorm, w.Load(p + "hnorm.weight", {hidden}));
    ASSIGN_OR_RETURN(mtp.eh_proj, w.Load(p + "eh_proj.weight", {hidden, 2 * hidden}));
    ASSIGN_OR_RETURN(mtp.head_norm, w.Load(p + "shared_head.norm.weight", {hidden}));
    // The embedding and LM head are shared with the main model (the checkpoint may repeat them).
    RETURN_IF_ERROR(LoadLayer(w, p, /*is_moe=*/true, &mtp.layer));
  }

  if (w.num_native_fp8() > 0 || !w.dequantised_fp8().empty()) {
    std::string names;
    for (size_t i = 0; i < w.dequantised_fp8().size() && i < 4; ++i) names += (i ? "; " : "") + w.dequantised_fp8()[i];
    LOG(INFO) << "FP8: " << w.num_native_fp8() << " projection weights kept FP8 (block-scaled GEMMs), "
              << w.dequantised_fp8().size() << " dequantised to bf16" << (names.empty() ? "" : ": " + names)
              << (w.dequantised_fp8().size() > 4 ? "; ..." : "");
  }
  rope_.rotary_dim = static_cast<int>(rope);
  rope_.theta = static_cast<float>(c.rope.theta);
  rope_.interleaved = c.rope.interleaved;
  attention_scale_ = 1.0f / std::sqrt(static_cast<float>(qk_head));
  if (c.rope.type == "yarn") {
    auto mscale = [&](double scale, double ms) { return scale <= 1 ? 1.0 : 0.1 * ms * std::log(scale) + 1.0; };
    rope_.yarn_factor = static_cast<float>(c.rope.factor);
    rope_.yarn_original_max_positions = c.rope.original_max_position_embeddings;
    rope_.yarn_beta_fast = static_cast<float>(c.rope.beta_fast);
    rope_.yarn_beta_slow = static_cast<float>(c.rope.beta_slow);
    rope_.attention_factor = static_cast<float>(
        c.rope.mscale != 0 && c.rope.mscale_all_dim != 0
            ? mscale(c.rope.factor, c.rope.mscale) / mscale(c.rope.factor, c.rope.mscale_all_dim)
            : mscale(c.rope.factor, 1.0));
    if (c.rope.mscale_all_dim != 0) {
      double s = mscale(c.rope.factor, c.rope.mscale_all_dim);
      attention_scale_ *= static_cast<float>(s * s);
    }
  }
  // Multi-token-prediction layers (model.layers.<num_hidden_layers>.*) stay on disk until the
  // speculative decoding that uses them exists.
  auto is_mtp_copy = [&](const std::string& name) {  // MTP's copies of the shared embedding/head
    for (int i = 0; i < c.num_nextn_predict_layers; ++i) {
      const std::string p = root + "layers." + std::to_string(c.num_layers + i) + ".";
      if (name == p + "embed_tokens.weight" || name == p + "shared_head.head.weight") return true;
    }
    return false;
  };
  return w.CheckAllUsed([&](const std::string& name) {
    return is_mtp_copy(name) || name.find("rotary_emb.inv_freq") != std::string::npos ||
           (c.tie_word_embeddings && name == "lm_head.weight");
  });
}

void DeepseekV3Model::Ffn(const FfnWeights& f, const TensorView& x, const TensorView& out) {
  const int64_t tokens = x.dim(0), inter = f.down.cols;
  const DType act = backend_.activation_dtype();
  Tensor gate_up = backend_.Empty(act, {tokens, 2 * inter});
  Tensor h = backend_.Empty(act, {tokens, inter});
  RunLinear(backend_, x, f.gate_up, gate_up);
  backend_.SiluMul(gate_up, h);
  RunLinear(backend_, h, f.down, out);
}

void DeepseekV3Model::Moe(const LayerWeights& lw, const TensorView& x, const TensorView& out) {
  const ModelConfig& c = config_;
  const int64_t tokens = x.dim(0), k = c.num_experts_per_token;
  Tensor router_logits = backend_.Empty(DType::kF32, {tokens, c.num_experts});  // [T, E]
  Tensor topk_ids = backend_.Empty(DType::kI32, {tokens, k});
  Tensor topk_weights = backend_.Empty(DType::kF32, {tokens, k});
  backend_.Linear(x, lw.router, router_logits);
  MoeRouting routing;
  routing.top_k = static_cast<int>(k);
  routing.renormalize = c.norm_topk_prob;
  routing.sigmoid = c.scoring_func == "sigmoid";
  routing.num_groups = c.num_expert_groups;
  routing.topk_groups = c.topk_groups;
  routing.scaling_factor = static_cast<float>(c.routed_scaling_factor);
  routing.correction_bias = lw.router_bias.view();
  backend_.MoeRoute(router_logits, routing, topk_ids, topk_weights);
  // DP-EP: the shared experts (whole here, on this rank's tokens) run on the side stream while
  // the routed tokens travel to their experts' ranks and back.
  const bool overlap = ep_exchange_ && c.num_shared_experts > 0 && OverlapSharedExpert();
  Tensor shared;
  if (overlap) {
    shared = backend_.Empty(backend_.activation_dtype(), {tokens, c.hidden_size});
    backend_.RunOnSideStream([&] { Ffn(lw.shared, x, shared); });
  }
  if (ep_exchange_) {
    // DP-EP: routed on the token's own rank (above), run on the experts' ranks.
    ExpertsOverRanks(lw, x, topk_ids, topk_weights, out);
  } else {
    // TP-EP: every rank routes all tokens and runs the pairs of its own experts.
    if (shard_.ep_size > 1) ToLocalExpertIds(backend_, topk_ids, first_expert_);
    RoutedExperts(lw, x, topk_ids, topk_weights, out);
  }
  if (c.num_shared_experts > 0) {
    // TP: this rank's columns of the shared experts. DP-EP: all of them (--tp 1) or this TP
    // rank's columns, on the replica's tokens.
    if (overlap) {
      backend_.JoinSideStream();
    } else {
      shared = backend_.Empty(backend_.activation_dtype(), {tokens, c.hidden_size});
      Ffn(lw.shared, x, shared);
    }
    backend_.Add(out, shared);
  }
  // TP-EP: local experts + shared-expert slice of every rank. DP-EP: out is whole with --tp 1;
  // with --tp > 1 the TP all-reduce adds the other TP ranks' rows and shared-expert slices.
  AllReduce(ep_exchange_ ? shard_.tp : shard_.ep, out);
}

void DeepseekV3Model::RoutedExperts(const LayerWeights& lw, const TensorView& x, const TensorView& topk_ids,
                                    const TensorView& topk_weights, const TensorView& out) {
  const ExpertsFp8& f = lw.experts_fp8;
  if (f.loaded())
    backend_.MoeExpertsFp8(x, topk_ids, topk_weights, f.gate_up, f.gate_up_scale, f.down, f.down_scale, out);
  else
    backend_.MoeExperts(x, topk_ids, topk_weights, lw.experts_gate_up, lw.experts_down, out);
}

void DeepseekV3Model::ExpertsOverRanks(const LayerWeights& lw, const TensorView& x, const TensorView& topk_ids,
                                       const TensorView& topk_weights, const TensorView& out) {
  ExpertInputs in = ep_exchange_->Dispatch(x, topk_ids, topk_weights);  // [R, H], [R, K] local ids
  Tensor expert_out = backend_.Empty(backend_.activation_dtype(), {in.rows(), config_.hidden_size});  // [R, H]
  if (in.rows() > 0)
    RoutedExperts(lw, in.x, in.topk_ids, in.topk_weights, expert_out);
  ep_exchange_->Combine(expert_out, out);
}

void DeepseekV3Model::IdleStep() {
  if (!ep_exchange_) return;
  const int64_t hidden = config_.hidden_size, k = config_.num_experts_per_token;
  Tensor x = backend_.Empty(backend_.activation_dtype(), {0, hidden});
  Tensor ids = backend_.Empty(DType::kI32, {0, k});
  Tensor weights = backend_.Empty(DType::kF32, {0, k});
  for (const LayerWeights& lw : layers_)  // the decoder's MoE layers (the MTP modules do not run)
    if (lw.is_moe) ExpertsOverRanks(lw, x, ids, weights, x);
}

// Scores against the latent: q_latent[h] = q_nope[h] W_UK[h] (kv_lora dims) joined with q_rope,
// one shared latent "head"; the output's latent part goes through W_UV[h]. Both per-head
// products are one batched GEMM over the heads, reading q_nope in place.
void DeepseekV3Model::AbsorbedAttention(const MlaWeights& w, const TensorView& q, const ForwardBatch& batch,
                                        const KvCacheView& cache, const TensorView& out) {
  const MlaConfig& m = config_.mla;
  const int64_t tokens = q.dim(0), heads = num_heads_;
  const int64_t nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, qk_head = m.qk_head_dim();
  const int64_t kv_lora = m.kv_lora_rank, latent = kv_lora + rope;
  const DType act = backend_.activation_dtype();
  Tensor q_lat = backend_.Empty(act, {tokens, heads, latent});  // [T, Hl, kv_lora + rope]
  Tensor o_lat = backend_.Empty(act, {tokens, heads, kv_lora});  // [T, Hl, kv_lora]
  TensorView q2d = q.Reshape({tokens, heads * qk_head});
  TensorView q_lat2d = q_lat.view().Reshape({tokens, heads * latent});
  // [T, Hl, nope] x [Hl, kv_lora, nope]^T -> [T, Hl, kv_lora], then q_rope [T, Hl, rope] beside it.
  backend_.BatchedLinear(Heads(q2d, heads, qk_head, 0, nope), w.uk_t, Heads(q_lat2d, heads, latent, 0, kv_lora));
  backend_.Copy(Heads(q2d, heads, qk_head, nope, rope), Heads(q_lat2d, heads, latent, kv_lora, rope));
  backend_.Attention(q_lat, cache, batch.attention, attention_scale_, o_lat);
  // [T, Hl, kv_lora] x [Hl, v, kv_lora]^T -> [T, Hl, v]
  backend_.BatchedLinear(o_lat, w.uv, out.Reshape({tokens, heads, m.v_head_dim}));
}

// Per sequence: the latents of its whole context, decompressed to per-head keys and values,
// attended by the chunk's queries through a one-block cache of their own.
void DeepseekV3Model::DecompressedAttention(const MlaWeights& w, const TensorView& q, const ForwardBatch& batch,
                                            const KvCacheView& cache, const TensorView& out) {
  const MlaConfig& m = config_.mla;
  const int64_t heads = num_heads_, kv_lora = m.kv_lora_rank, rope = m.qk_rope_head_dim;
  const int64_t nope = m.qk_nope_head_dim, vdim = m.v_head_dim, qk_head = m.qk_head_dim();
  const DType act = backend_.activation_dtype();
  const AttentionBatch& ab = batch.attention;
  const int64_t num_seqs = ab.seq_lens.numel(), table_width = ab.block_tables.dim(1);
  // The batch's metadata on the host, read once per forward (each read waits for the device).
  if (!host_meta_.valid) {
    host_meta_.query_start.resize(num_seqs + 1);
    host_meta_.seq_lens.resize(num_seqs);
    host_meta_.block_tables.resize(num_seqs * table_width);
    backend_.CopyToHost(ab.query_start, host_meta_.query_start.data());
    backend_.CopyToHost(ab.seq_lens, host_meta_.seq_lens.data());
    backend_.CopyToHost(ab.block_tables, host_meta_.block_tables.data());
    const int bs = cache.block_size();  // every layer's cache has the same blocks
    host_meta_.seqs.clear();
    for (int64_t b = 0; b < num_seqs; ++b) {
      const int32_t ctx = host_meta_.seq_lens[b];
      const int32_t q_len = host_meta_.query_start[b + 1] - host_meta_.query_start[b];
      std::vector<int32_t> rows(ctx), meta{0, q_len, ctx, 0};
      for (int32_t j = 0; j < ctx; ++j)
        rows[j] = host_meta_.block_tables[b * table_width + j / bs] * bs + j % bs;
      HostBatchMeta::Seq seq{backend_.Empty(DType::kI32, {ctx}), backend_.Empty(DType::kI32, {4})};
      backend_.CopyFromHost(rows.data(), seq.cache_rows);
      backend_.CopyFromHost(meta.data(), seq.meta);
      host_meta_.seqs.push_back(std::move(seq));
    }
    host_meta_.valid = true;
  }
  const std::vector<int32_t>& qstart = host_meta_.query_start;
  const std::vector<int32_t>& seq_lens = host_meta_.seq_lens;
  const int bs = cache.block_size();

  for (int64_t b = 0; b < num_seqs; ++b) {
    const int64_t ctx = seq_lens[b], q_len = qstart[b + 1] - qstart[b];
    const HostBatchMeta::Seq& seq = host_meta_.seqs[b];
    // Gather the context's latents from the paged cache ([num_blocks * bs, D] as rows, one
    // latent head): [ctx, kv_lora + rope]. One gather: a copy a block was ~4.5 us a launch on an
    // H200, 2.3 ms a layer of an 8k DeepSeek-V3 prompt.
    Tensor lat = backend_.Empty(act, {ctx, kv_lora + rope});
    backend_.GatherRows(cache.k.Reshape({cache.k.dim(0) * bs, kv_lora + rope}), seq.cache_rows,
                        lat);
    Tensor kv = backend_.Empty(act, {ctx, heads * (nope + vdim)});  // [ctx, Hl * (nope + v)]
    backend_.Linear(Columns(lat, 0, kv_lora), w.kv_b, kv);
    // A cache of one block holding exactly this context, in slot order ([1, Hl, ctx, d]), written
    // in place through token-major views: each head's k is its nope columns of kv, then the
    // latent's rope dims (one row read by every head); v its v columns.
    Tensor k_cache = backend_.Empty(act, {1, heads, ctx, qk_head});
    Tensor v_cache = backend_.Empty(act, {1, heads, ctx, vdim});
    backend_.Copy(Heads(kv, heads, nope + vdim, 0, nope), TokenMajor(k_cache, 0, nope));
    TensorView k_rope = Heads(lat, heads, 0, kv_lora, rope);  // [ctx, Hl, rope], head stride 0
    backend_.Copy(k_rope, TokenMajor(k_cache, nope, rope));
    backend_.Copy(Heads(kv, heads, nope + vdim, nope, vdim), TokenMajor(v_cache, 0, vdim));
    AttentionBatch one;
    one.query_start = seq.meta.view().Slice(0, 2);
    one.seq_lens = seq.meta.view().Slice(2, 3);
    one.block_tables = seq.meta.view().Slice(3, 4).Reshape({1, 1});
    one.max_q_len = static_cast<int>(q_len);
    one.max_seq_len = static_cast<int>(ctx);
    KvCacheView seq_cache{k_cache, v_cache};
    TensorView q_seq = q.Slice(qstart[b], qstart[b + 1]);
    TensorView out_seq = out.Slice(qstart[b], qstart[b + 1]).Reshape({q_len, heads, vdim});
    backend_.Attention(q_seq, seq_cache, one, attention_scale_, out_seq);
  }
}

void DeepseekV3Model::Attention(int layer, const TensorView& x, const ForwardBatch& batch,
                                const KvCacheView& cache, bool absorbed, const TensorView& out) {
  const ModelConfig& c = config_;
  const MlaConfig& m = c.mla;
  const MlaWeights& w = layers_[layer].attn;
  const int64_t tokens = x.dim(0), heads = num_heads_, qk_head = m.qk_head_dim();  // this rank's heads
  const int64_t kv_lora = m.kv_lora_rank, rope = m.qk_rope_head_dim;
  const int64_t q_in = m.q_lora_rank > 0 ? m.q_lora_rank : heads * qk_head;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const DType act = backend_.activation_dtype();

  Tensor a = backend_.Empty(act, {tokens, q_in + kv_lora + rope});  // [T, q_in | kv_lora | rope]
  RunLinear(backend_, x, w.in_proj, a);
  Tensor q_buf;
  TensorView q;  // [T, Hl, nope + rope]
  if (m.q_lora_rank > 0) {
    Tensor q_c = backend_.Empty(act, {tokens, q_in});
    backend_.RmsNorm(Columns(a, 0, q_in), w.q_a_norm, eps, q_c, nullptr);
    q_buf = backend_.Empty(act, {tokens, heads, qk_head});
    RunLinear(backend_, q_c, w.q_b, q_buf.view().Reshape({tokens, heads * qk_head}));
    q = q_buf;
  } else {
    q = Heads(a, heads, qk_head, 0, qk_head);
    q_buf = backend_.Empty(act, {tokens, heads, qk_head});
    backend_.Copy(q, q_buf);
    q = q_buf;
  }
  // The latent row of each token, normed in place and with its key rotated: [T, 1, kv_lora + rope].
  TensorView latent = Heads(a, 1, kv_lora + rope, q_in, kv_lora + rope);
  TensorView kv_part = Columns(a, q_in, kv_lora);
  backend_.RmsNorm(kv_part, w.kv_a_norm, eps, kv_part, nullptr);
  backend_.Rope(Heads(q, heads, qk_head, m.qk_nope_head_dim, rope),
                Heads(a, 1, kv_lora + rope, q_in + kv_lora, rope), batch.positions, rope_);
  backend_.KvWrite(latent, latent, cache, batch.attention);

  Tensor attn = backend_.Empty(act, {tokens, heads * m.v_head_dim});  // [T, Hl * v]
  if (absorbed) {
    AbsorbedAttention(w, q, batch, cache, attn);
  } else {
    DecompressedAttention(w, q, batch, cache, attn);
  }
  RunLinear(backend_, attn, w.o, out);  // [T, H], this rank's partial sum
  AllReduce(shard_.tp, out);
}

void DeepseekV3Model::Forward(const ForwardBatch& batch, std::span<const KvCacheView> kv_caches,
                              const TensorView& logits) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (ep_exchange_) ep_exchange_->SelectFixedCapacity(batch.ep_fixed_capacity);
  if (batch.token_ids.rank() == 1 && batch.token_ids.dim(0) == 0) return IdleStep();
  backend_.PlanStep(batch.attention, batch.token_ids.dim(0));
  COROLLA_CHECK_EQ(static_cast<int>(kv_caches.size()), c.num_layers);
  const bool absorbed = mode_ == MlaMode::kAbsorbed || (mode_ == MlaMode::kAuto && batch.attention.max_q_len <= 1);
  host_meta_.valid = false;

  ResidualStream stream(backend_, batch, embed_, hidden, eps, layers_[0].input_norm);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = layers_[l];
    Attention(l, stream.x(), batch, kv_caches[l], absorbed, stream.y());
    stream.Add(lw.post_attention_norm);
    if (lw.is_moe) {
      Moe(lw, stream.x(), stream.y());
    } else {
      Ffn(lw.dense, stream.x(), stream.y());  // [T, H], this rank's partial sum
      AllReduce(shard_.tp, stream.y());
    }
    stream.Add(l + 1 < c.num_layers ? layers_[l + 1].input_norm : final_norm_);
  }
  stream.Logits(batch, lm_head_, logits);
}

}  // namespace

Result<std::unique_ptr<Model>> LoadDeepseekV3(const ModelConfig& config, const Checkpoint& checkpoint,
                                              Backend& backend, const ModelShard& shard) {
  auto model = std::make_unique<DeepseekV3Model>(config, backend, shard);
  RETURN_IF_ERROR(model->Load(checkpoint));
  return std::unique_ptr<Model>(std::move(model));
}

int NumMtpModules(const Model& model) {
  auto* ds = dynamic_cast<const DeepseekV3Model*>(&model);
  return ds ? ds->num_mtp_modules() : 0;
}

void SetMlaMode(Model& model, MlaMode mode) {
  auto* ds = dynamic_cast<DeepseekV3Model*>(&model);
  COROLLA_CHECK(ds != nullptr) << "not a DeepSeek-V3 model";
  ds->set_mode(mode);
}

}  // namespace corolla
