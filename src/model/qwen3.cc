#include "model/qwen3.h"

#include <cmath>
#include <optional>
#include <vector>

#include "model/gated_deltanet.h"
#include "model/residual_stream.h"
#include "model/weights.h"
#include "parallel/communicator.h"
#include "parallel/expert_parallel.h"

namespace corolla {
namespace {

struct AttentionWeights {
  Tensor qkv;     // [(Hq (x2 with the output gate) + 2 Hk) * D, H]: q_proj | k_proj | v_proj rows
  Tensor o;       // [H, Hq * D]
  Tensor q_norm;  // [D]
  Tensor k_norm;  // [D]
};

struct MlpWeights {     // dense SwiGLU
  Tensor gate_up;       // [2I, H]: gate_proj | up_proj rows
  Tensor down;          // [H, I]
};

struct MoeWeights {
  Tensor router;        // [E, H]
  Tensor gate_up;       // [E, 2I, H]
  Tensor down;          // [E, H, I]
  MlpWeights shared;    // Qwen3.5: one shared expert ...
  Tensor shared_gate;   // ... scaled by sigmoid(x . shared_gate), [1, H]
};

struct LayerWeights {
  Tensor input_norm;         // [H]
  Tensor post_attention_norm;  // [H]
  bool is_linear = false;    // Gated DeltaNet instead of attention
  int cache_idx = 0;         // index among the KV layers (attention) or state layers (linear)
  AttentionWeights attn;
  GatedDeltaNetWeights linear;
  bool is_moe = false;
  MlpWeights mlp;
  MoeWeights moe;
};

class Qwen3Model final : public Model {
 public:
  Qwen3Model(ModelConfig config, Backend& backend, const ModelShard& shard)
      : config_(std::move(config)), backend_(backend), shard_(shard) {}

  Status Load(const Checkpoint& checkpoint);

  const ModelConfig& config() const override { return config_; }
  KvCacheSpec kv_cache_spec() const override {
    return {config_.num_layers - config_.num_linear_layers(), num_kv_heads_, config_.head_dim};
  }
  StateSpec state_spec() const override {  // this rank's heads
    const LinearAttentionConfig& la = config_.linear;
    if (config_.num_linear_layers() == 0) return {};
    return {config_.num_linear_layers(), linear_heads_.conv_channels(la), la.conv_kernel - 1,
            linear_heads_.num_value_heads, la.key_head_dim, la.value_head_dim};
  }
  void Forward(const ForwardBatch& batch, std::span<const KvCacheView> kv_caches,
               const TensorView& logits) override;

 private:
  // The layer's attention of stream.x() into stream.y(); with input_norm, stream.Add(*input_norm)
  // first, as one backend op with the qkv projection (RmsNormLinear, which a backend may fuse),
  // or, where the MLP block before folded its output into the sum already (`added`), the norm
  // alone with it (NormLinear).
  void AttentionBlock(int layer, ResidualStream& stream, const Tensor* input_norm, bool added,
                      const ForwardBatch& batch, const KvCacheView& cache);
  // The layer's MLP (dense or MoE) after its post-attention norm: stream.Add(norm) and the MLP of
  // stream.x() into stream.y(); a MoE layer's norm and router are one backend op
  // (RmsNormMoeRouter), which a backend may fuse. With `fold` (the next block norms the sum with
  // NormLinear), a MoE layer on one rank without a shared expert adds its output into the sum
  // itself where the backend folds that (MoeExpertsResidual): returns whether it did.
  bool MlpBlock(int layer, ResidualStream& stream, const Tensor& norm, bool fold);
  // DP-EP: this rank's tokens x [T, H] go to the ranks of their experts (topk_ids global) and
  // their outputs come back summed into out [T, H]; T may be 0. With --tp > 1 only this TP
  // rank's rows of them (the exchange slices; out's other rows are zero).
  void ExpertsOverRanks(const MoeWeights& w, const TensorView& x, const TensorView& topk_ids,
                        const TensorView& topk_weights, const TensorView& out);
  // DP-EP with no tokens on this rank: only every MoE layer's exchanges, with zero rows.
  void IdleStep();
  // All layers in one Backend::DecodeMoeStack call, for one decode token of a model it
  // describes (decode_stack_ set at load); false (nothing run) otherwise or where the backend
  // declines. Leaves stream.x() ready for the LM head.
  bool DecodeStack(const ForwardBatch& batch, std::span<const KvCacheView> kv_caches, ResidualStream& stream);
  void PlanDecodeStack();
  void Mlp(const MlpWeights& w, const TensorView& x, const TensorView& out);
  // Qwen3.5's shared expert of x [T, H] into out [T, H]: Mlp scaled by sigmoid(x . shared_gate).
  void SharedExpert(const MoeWeights& w, const TensorView& x, const TensorView& out);
  Result<Tensor> LoadNorm(WeightLoader& w, const std::string& name, int64_t dim);
  // Splits heads, MLP columns and experts over the shard's ranks (all of them for one rank).
  Status PlanShard();
  // Sums a row-parallel output over `comm`'s ranks (nothing without one).
  void AllReduce(Communicator* comm, const TensorView& x) {
    if (comm != nullptr) comm->AllReduceSum(x);
  }

  ModelConfig config_;
  Backend& backend_;
  ModelShard shard_;
  // This rank's part: query heads [first_q_head_, + num_q_heads_), KV heads
  // [first_kv_head_, + num_kv_heads_), MLP rows [.. inter / tp ..), experts [first_expert_, + num_local_experts_).
  int num_q_heads_ = 0, first_q_head_ = 0;
  int num_kv_heads_ = 0, first_kv_head_ = 0;
  int num_local_experts_ = 0, first_expert_ = 0;
  LinearHeads linear_heads_;  // hybrids: this rank's Gated DeltaNet heads
  std::unique_ptr<EpExchange> ep_exchange_;  // DP-EP only
  Tensor embed_;    // [V, H]
  Tensor lm_head_;  // [V, H] (the embedding when tied)
  Tensor final_norm_;
  std::vector<LayerWeights> layers_;
  std::optional<MoeDecoderStack> decode_stack_;  // every layer attention + routed experts, one rank
};

Status Qwen3Model::PlanShard() {
  const ModelConfig& c = config_;
  const int tp = shard_.tp_size, hq = c.num_attention_heads, hk = c.num_kv_heads;
  auto fail = [&](const std::string& why) {
    return InvalidArgument(c.model_type + " does not split over --tp " + std::to_string(tp) + " / --ep " +
                           std::to_string(shard_.ep_size) + ": " + why);
  };
  RETURN_IF_ERROR(CheckExpertLayout(shard_, c.model_type, c.num_experts > 0));
  if (c.num_linear_layers() > 0) {
    Result<LinearHeads> heads = PlanLinearHeads(c.linear, tp, shard_.tp_rank);
    if (!heads.ok()) return fail(heads.status().message());
    linear_heads_ = *heads;
  }
  if (hq % tp != 0) return fail(std::to_string(hq) + " query heads");
  num_q_heads_ = hq / tp;
  first_q_head_ = shard_.tp_rank * num_q_heads_;
  if (hk >= tp) {
    if (hk % tp != 0) return fail(std::to_string(hk) + " KV heads");
    num_kv_heads_ = hk / tp;
    first_kv_head_ = shard_.tp_rank * num_kv_heads_;
  } else {  // each rank keeps the one KV head its query heads read (replicated over tp / hk ranks)
    if (tp % hk != 0) return fail(std::to_string(hk) + " KV heads");
    num_kv_heads_ = 1;
    first_kv_head_ = first_q_head_ / (hq / hk);
  }
  for (int l = 0; l < c.num_layers; ++l)
    if (!c.is_moe_layer(l) && c.intermediate_size % tp != 0)
      return fail("intermediate size " + std::to_string(c.intermediate_size));
  if (c.shared_expert_intermediate_size % tp != 0) return fail("shared expert size " + std::to_string(c.shared_expert_intermediate_size));
  const int ep = shard_.ep_size;
  if (c.num_experts % ep != 0) return fail(std::to_string(c.num_experts) + " experts");
  num_local_experts_ = c.num_experts / ep;
  first_expert_ = shard_.ep_rank * num_local_experts_;
  if (shard_.uses_ep_exchange() && c.num_experts > 0) {
    if (ep > kMaxEpRanks) return fail("at most " + std::to_string(kMaxEpRanks) + " EP ranks");
    ASSIGN_OR_RETURN(ep_exchange_, MakeEpExchange(backend_, *shard_.ep,
                                                 {c.num_experts, shard_.ep_capacity, shard_.ep_sized_fallback},
                                                 c.hidden_size, c.num_experts_per_token, tp, shard_.tp_rank));
  }
  return Status::Ok();
}

Status Qwen3Model::Load(const Checkpoint& checkpoint) {
  const ModelConfig& c = config_;
  RETURN_IF_ERROR(PlanShard());
  WeightLoader w(checkpoint, backend_);
  const int tp = shard_.tp_size, tp_rank = shard_.tp_rank;
  const std::string& root = c.weight_prefix;  // "model." (or "model.language_model.")
  const int64_t hidden = c.hidden_size, d = c.head_dim;
  ASSIGN_OR_RETURN(embed_, w.Load(root + "embed_tokens.weight", {c.vocab_size, hidden}));
  ASSIGN_OR_RETURN(final_norm_, LoadNorm(w, root + "norm.weight", hidden));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    ASSIGN_OR_RETURN(lm_head_, w.Load("lm_head.weight", {c.vocab_size, hidden}));
  }
  if (c.num_linear_layers() > 0 && !backend_.supports_linear_attention())
    return Unsupported(c.model_type + ": the " + backend_.name() +
                       " backend has no Gated DeltaNet kernels yet (use --device cpu)");
  const int64_t q_rows = c.q_size() * (c.attention_output_gate ? 2 : 1);
  layers_.resize(c.num_layers);
  int num_attention = 0, num_linear = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& lw = layers_[l];
    std::string p = root + "layers." + std::to_string(l) + ".";
    ASSIGN_OR_RETURN(lw.input_norm, LoadNorm(w, p + "input_layernorm.weight", hidden));
    ASSIGN_OR_RETURN(lw.post_attention_norm, LoadNorm(w, p + "post_attention_layernorm.weight", hidden));
    lw.is_linear = c.layer_kinds[l] == LayerKind::kLinearAttention;
    lw.cache_idx = lw.is_linear ? num_linear++ : num_attention++;
    if (lw.is_linear) {
      RETURN_IF_ERROR(LoadGatedDeltaNet(w, backend_, c, linear_heads_, p + "linear_attn.", &lw.linear));
    } else {
      std::string a = p + "self_attn.";
      // Column-parallel q|k|v (this rank's heads; a head's rows are contiguous, [q | gate] with
      // the output gate), row-parallel o_proj (the matching input columns).
      const int64_t q_head_rows = q_rows / c.num_attention_heads;
      const Shard q_part = Shard::Rows(first_q_head_ * q_head_rows, (first_q_head_ + num_q_heads_) * q_head_rows);
      const Shard kv_part = Shard::Rows(first_kv_head_ * d, (first_kv_head_ + num_kv_heads_) * d);
      ASSIGN_OR_RETURN(lw.attn.qkv, w.LoadConcat({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                                                 {{q_rows, hidden}, {c.kv_size(), hidden}, {c.kv_size(), hidden}},
                                                 {q_part, kv_part, kv_part}));
      ASSIGN_OR_RETURN(lw.attn.o, w.Load(a + "o_proj.weight", {hidden, c.q_size()},
                                         Shard::Cols(first_q_head_ * d, (first_q_head_ + num_q_heads_) * d)));
      ASSIGN_OR_RETURN(lw.attn.q_norm, LoadNorm(w, a + "q_norm.weight", d));
      ASSIGN_OR_RETURN(lw.attn.k_norm, LoadNorm(w, a + "k_norm.weight", d));
    }
    std::string m = p + "mlp.";
    lw.is_moe = c.is_moe_layer(l);
    if (lw.is_moe) {
      const int e = c.num_experts, inter = c.moe_intermediate_size;
      ASSIGN_OR_RETURN(lw.moe.router, w.Load(m + "gate.weight", {e, hidden}));
      ASSIGN_OR_RETURN(lw.moe.gate_up, w.LoadExpertsGateUp(m + "experts.", e, inter, c.hidden_size, first_expert_,
                                                           num_local_experts_));
      ASSIGN_OR_RETURN(lw.moe.down, w.LoadExpertsDown(m + "experts.", e, inter, c.hidden_size, first_expert_,
                                                      num_local_experts_));
      if (c.shared_expert_intermediate_size > 0) {  // tensor-parallel like a dense MLP
        const int64_t si = c.shared_expert_intermediate_size;
        const Shard rows = Shard::Part(0, si, tp_rank, tp), cols = Shard::Part(1, si, tp_rank, tp);
        std::string se = m + "shared_expert.";
        ASSIGN_OR_RETURN(lw.moe.shared.gate_up, w.LoadConcat({se + "gate_proj.weight", se + "up_proj.weight"},
                                                             {{si, hidden}, {si, hidden}}, {rows, rows}));
        ASSIGN_OR_RETURN(lw.moe.shared.down, w.Load(se + "down_proj.weight", {hidden, si}, cols));
        ASSIGN_OR_RETURN(lw.moe.shared_gate, w.Load(m + "shared_expert_gate.weight", {1, hidden}));
      }
    } else {
      const int64_t inter = c.intermediate_size;
      const Shard rows = Shard::Part(0, inter, tp_rank, tp), cols = Shard::Part(1, inter, tp_rank, tp);
      ASSIGN_OR_RETURN(lw.mlp.gate_up, w.LoadConcat({m + "gate_proj.weight", m + "up_proj.weight"},
                                                    {{inter, hidden}, {inter, hidden}}, {rows, rows}));
      ASSIGN_OR_RETURN(lw.mlp.down, w.Load(m + "down_proj.weight", {hidden, inter}, cols));
    }
  }
  PlanDecodeStack();
  return w.CheckAllUsed([&](const std::string& name) {
    // Tied checkpoints may still carry lm_head.weight; old exports carry rotary buffers;
    // Qwen3.5 checkpoints carry multi-token-prediction weights (mtp.*) for speculation.
    return (c.tie_word_embeddings && name == "lm_head.weight") ||
           name.find("rotary_emb.inv_freq") != std::string::npos || name.rfind("mtp.", 0) == 0;
  });
}

// Qwen3.5's RMSNorms scale by (1 + weight); folding the 1 in at load leaves one norm kernel.
Result<Tensor> Qwen3Model::LoadNorm(WeightLoader& w, const std::string& name, int64_t dim) {
  if (!config_.zero_centered_norm) return w.Load(name, {dim});
  ASSIGN_OR_RETURN(Tensor host, w.LoadHost(name, {dim}));
  for (int64_t i = 0; i < dim; ++i) host.ptr<float>()[i] += 1.0f;
  // Kept in f32 on every backend: bf16 would round 1 + w to 2^-8, which moves this model's
  // logits by up to 1.6e-1 of their range over 130 tokens (measured on the CPU).
  Tensor t = backend_.Empty(DType::kF32, {dim});
  backend_.CopyFromHost(host.view().data, t);
  return t;
}

void Qwen3Model::AttentionBlock(int layer, ResidualStream& stream, const Tensor* input_norm, bool added,
                                const ForwardBatch& batch, const KvCacheView& cache) {
  const ModelConfig& c = config_;
  const TensorView& x = stream.x();
  const TensorView& out = stream.y();
  const AttentionWeights& w = layers_[layer].attn;
  const int64_t tokens = x.dim(0), d = c.head_dim, hq = num_q_heads_, hk = num_kv_heads_;  // this rank's heads
  const DType act = backend_.activation_dtype();

  // With the output gate, q_proj yields [q (D) | gate (D)] per head.
  const int64_t q_cols = hq * d * (c.attention_output_gate ? 2 : 1), width = q_cols + 2 * hk * d;
  Tensor qkv = backend_.Empty(act, {tokens, width});  // [T, q | k | v]
  if (input_norm != nullptr && added)
    backend_.NormLinear(*input_norm, stream.eps(), stream.sum(), x, w.qkv, qkv);
  else if (input_norm != nullptr)
    backend_.RmsNormLinear(out, *input_norm, stream.eps(), stream.sum(), x, w.qkv, qkv);
  else
    backend_.Linear(x, w.qkv, qkv);
  // Strided views into qkv: q [T, Hq, D], k [T, Hk, D], v [T, Hk, D], gate [T, Hq, D].
  auto heads = [&](int64_t first_col, int64_t num_heads, int64_t head_stride) {
    TensorView v = qkv.view();
    v.data = static_cast<char*>(v.data) + first_col * DTypeSize(act);
    v.shape = {tokens, num_heads, d};
    v.strides = {width, head_stride, 1, 0};
    return v;
  };
  const int64_t q_stride = c.attention_output_gate ? 2 * d : d;
  TensorView q = heads(0, hq, q_stride), k = heads(q_cols, hk, d), v = heads(q_cols + hk * d, hk, d);
  Tensor attn = backend_.Empty(act, {tokens, hq, d});  // [T, Hq, D]
  const float eps = static_cast<float>(c.rms_norm_eps), scale = 1.0f / std::sqrt(static_cast<float>(d));
  const RopeParams rope{c.rotary_dim(), static_cast<float>(c.rope.theta)};
  if (!c.attention_output_gate) {  // the attention and o_proj: one op the backend may fuse
    backend_.QkNormRopeAttentionProj(q, k, v, w.q_norm, w.k_norm, eps, batch.positions, rope, cache, batch.attention,
                                     scale, attn, w.o, out);  // out: [T, H], this rank's partial sum
    AllReduce(shard_.tp, out);
    return;
  }
  backend_.QkNormRopeAttention(q, k, v, w.q_norm, w.k_norm, eps, batch.positions, rope, cache, batch.attention, scale,
                               attn);
  TensorView attn2d = attn.view().Reshape({tokens, hq * d});
  Tensor gate = backend_.Empty(act, {tokens, hq, d});  // the output gate between the attention and o_proj
  backend_.Copy(heads(d, hq, q_stride), gate);
  backend_.SigmoidMul(attn2d, gate.view().Reshape({tokens, hq * d}));
  backend_.Linear(attn2d, w.o, out);  // [T, H], this rank's partial sum
  AllReduce(shard_.tp, out);
}

bool Qwen3Model::MlpBlock(int layer, ResidualStream& stream, const Tensor& norm, bool fold) {
  const ModelConfig& c = config_;
  const LayerWeights& lw = layers_[layer];
  const TensorView& x = stream.x();
  const TensorView& out = stream.y();
  const int64_t tokens = x.dim(0);
  const DType act = backend_.activation_dtype();
  if (!lw.is_moe) {
    stream.Add(norm);
    Mlp(lw.mlp, x, out);  // [T, H], this rank's partial sum
    AllReduce(shard_.tp, out);
    return false;
  }
  const int64_t k = c.num_experts_per_token;
  Tensor topk_ids = backend_.Empty(DType::kI32, {tokens, k});      // [T, K]
  Tensor topk_weights = backend_.Empty(DType::kF32, {tokens, k});  // [T, K]
  MoeRouting routing;  // softmax top-k of the router logits x @ router^T [T, E] (f32)
  routing.top_k = static_cast<int>(k);
  routing.renormalize = c.norm_topk_prob;
  // stream.Add(norm), then the router of x.
  backend_.RmsNormMoeRouter(out, norm, stream.eps(), stream.sum(), x, lw.moe.router, routing, topk_ids, topk_weights);
  // DP-EP: the shared expert (whole here, on this rank's tokens) runs on the side stream while
  // the routed tokens travel to their experts' ranks and back.
  const bool overlap = ep_exchange_ && lw.moe.shared_gate.defined() && OverlapSharedExpert();
  Tensor shared;
  if (overlap) {
    shared = backend_.Empty(act, {tokens, c.hidden_size});
    backend_.RunOnSideStream([&] { SharedExpert(lw.moe, x, shared); });
  }
  if (fold && shard_.tp_size == 1 && shard_.ep_size == 1 && !ep_exchange_ && !lw.moe.shared_gate.defined() &&
      backend_.folds_moe_residual(tokens)) {
    backend_.MoeExpertsResidual(x, topk_ids, topk_weights, lw.moe.gate_up, lw.moe.down, out, stream.sum());
    return true;
  }
  if (ep_exchange_) {
    ExpertsOverRanks(lw.moe, x, topk_ids, topk_weights, out);
  } else {
    // TP-EP: every rank routes all tokens and runs the pairs of its own experts.
    if (shard_.ep_size > 1) ToLocalExpertIds(backend_, topk_ids, first_expert_);
    backend_.MoeExperts(x, topk_ids, topk_weights, lw.moe.gate_up, lw.moe.down, out);
  }
  if (lw.moe.shared_gate.defined()) {
    if (overlap) {
      backend_.JoinSideStream();
    } else {
      shared = backend_.Empty(act, {tokens, c.hidden_size});
      SharedExpert(lw.moe, x, shared);
    }
    backend_.Add(out, shared);
  }
  // TP-EP: local experts (+ this rank's shared-expert slice) of every rank. DP-EP: out is whole
  // with --tp 1; with --tp > 1 each TP rank holds its rows' routed outputs (zeros elsewhere) and
  // its shared-expert slice, and the TP all-reduce assembles them.
  AllReduce(ep_exchange_ ? shard_.tp : shard_.ep, out);
  return false;
}

void Qwen3Model::SharedExpert(const MoeWeights& w, const TensorView& x, const TensorView& out) {
  Tensor gate = backend_.Empty(backend_.activation_dtype(), {x.dim(0), 1});  // [T, 1]
  Mlp(w.shared, x, out);
  backend_.Linear(x, w.shared_gate, gate);
  backend_.SigmoidMul(out, gate);
}

void Qwen3Model::ExpertsOverRanks(const MoeWeights& w, const TensorView& x, const TensorView& topk_ids,
                                  const TensorView& topk_weights, const TensorView& out) {
  ExpertInputs in = ep_exchange_->Dispatch(x, topk_ids, topk_weights);          // [R, H], [R, K] local ids
  Tensor expert_out = backend_.Empty(backend_.activation_dtype(), {in.rows(), config_.hidden_size});  // [R, H]
  if (in.rows() > 0) backend_.MoeExperts(in.x, in.topk_ids, in.topk_weights, w.gate_up, w.down, expert_out);
  ep_exchange_->Combine(expert_out, out);
}

void Qwen3Model::PlanDecodeStack() {
  const ModelConfig& c = config_;
  if (c.num_linear_layers() > 0 || c.attention_output_gate || c.shared_expert_intermediate_size > 0 ||
      shard_.tp_size != 1 || shard_.ep_size != 1 || ep_exchange_)
    return;
  MoeDecoderStack stack;
  for (const LayerWeights& lw : layers_) {
    if (!lw.is_moe) return;
    stack.layers.push_back({lw.input_norm, lw.attn.qkv, lw.attn.q_norm, lw.attn.k_norm, lw.attn.o,
                            lw.post_attention_norm, lw.moe.router, lw.moe.gate_up, lw.moe.down, {}});
  }
  stack.final_norm = final_norm_;
  stack.num_q_heads = num_q_heads_;
  stack.num_kv_heads = num_kv_heads_;
  stack.head_dim = c.head_dim;
  stack.eps = static_cast<float>(c.rms_norm_eps);
  stack.attention_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  stack.rope = {c.rotary_dim(), static_cast<float>(c.rope.theta)};
  stack.routing.top_k = c.num_experts_per_token;
  stack.routing.renormalize = c.norm_topk_prob;
  decode_stack_ = std::move(stack);
}

bool Qwen3Model::DecodeStack(const ForwardBatch& batch, std::span<const KvCacheView> kv_caches,
                             ResidualStream& stream) {
  if (!decode_stack_ || batch.token_ids.numel() != 1 || batch.attention.max_q_len != 1) return false;
  for (size_t l = 0; l < layers_.size(); ++l) decode_stack_->layers[l].cache = kv_caches[layers_[l].cache_idx];
  return backend_.DecodeMoeStack(*decode_stack_, batch.attention, batch.positions, stream.sum(), stream.x());
}

void Qwen3Model::IdleStep() {
  if (!ep_exchange_) return;
  const int64_t hidden = config_.hidden_size, k = config_.num_experts_per_token;
  Tensor x = backend_.Empty(backend_.activation_dtype(), {0, hidden});
  Tensor ids = backend_.Empty(DType::kI32, {0, k});
  Tensor weights = backend_.Empty(DType::kF32, {0, k});
  for (const LayerWeights& lw : layers_)
    if (lw.is_moe) ExpertsOverRanks(lw.moe, x, ids, weights, x);
}

void Qwen3Model::Mlp(const MlpWeights& w, const TensorView& x, const TensorView& out) {
  const int64_t tokens = x.dim(0), inter = w.down.dim(1);
  const DType act = backend_.activation_dtype();
  Tensor gate_up = backend_.Empty(act, {tokens, 2 * inter});  // [T, 2I]
  Tensor h = backend_.Empty(act, {tokens, inter});            // [T, I]
  backend_.Linear(x, w.gate_up, gate_up);
  backend_.SiluMul(gate_up, h);
  backend_.Linear(h, w.down, out);
}

void Qwen3Model::Forward(const ForwardBatch& batch, std::span<const KvCacheView> kv_caches,
                         const TensorView& logits) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (ep_exchange_) ep_exchange_->SelectFixedCapacity(batch.ep_fixed_capacity);
  if (batch.token_ids.rank() == 1 && batch.token_ids.dim(0) == 0) return IdleStep();
  backend_.PlanStep(batch.attention, batch.token_ids.dim(0));
  COROLLA_CHECK_EQ(static_cast<int>(kv_caches.size()), kv_cache_spec().num_layers);
  COROLLA_CHECK_EQ(static_cast<int>(batch.linear_states.size()), state_spec().num_layers);

  ResidualStream stream(backend_, batch, embed_, hidden, eps, layers_[0].input_norm);
  if (DecodeStack(batch, kv_caches, stream)) return stream.Logits(batch, lm_head_, logits);
  // The next attention layer's input norm, left to its qkv projection (RmsNormLinear); the
  // stream's constructor has normed the first layer's input.
  const Tensor* input_norm = nullptr;
  bool added = false;  // the MLP block before folded its output into the sum (MlpBlock)
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = layers_[l];
    if (lw.is_linear) {
      GatedDeltaNetForward(backend_, c, lw.linear, stream.x(), batch, batch.linear_states[lw.cache_idx], stream.y());
      AllReduce(shard_.tp, stream.y());  // out_proj is row-parallel over the value heads
    } else {
      if (lw.is_moe)  // (softmax routing: the hint's top k of the logits)
        backend_.HintMoeRouting(lw.post_attention_norm, stream.sum(), lw.moe.router, lw.moe.gate_up, lw.moe.down,
                                static_cast<int>(c.num_experts_per_token));
      AttentionBlock(l, stream, input_norm, added, batch, kv_caches[lw.cache_idx]);
    }
    const bool next_attention = l + 1 < c.num_layers && !layers_[l + 1].is_linear;
    added = MlpBlock(l, stream, lw.post_attention_norm, next_attention);
    input_norm = next_attention ? &layers_[l + 1].input_norm : nullptr;
    if (!next_attention) stream.Add(l + 1 < c.num_layers ? layers_[l + 1].input_norm : final_norm_);
  }
  stream.Logits(batch, lm_head_, logits);
}

}  // namespace

Result<std::unique_ptr<Model>> LoadQwen3(const ModelConfig& config, const Checkpoint& checkpoint,
                                         Backend& backend, const ModelShard& shard) {
  auto model = std::make_unique<Qwen3Model>(config, backend, shard);
  RETURN_IF_ERROR(model->Load(checkpoint));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace corolla
