// Model: a loaded checkpoint that runs one forward over a flat batch on a Backend.
// The engine owns the KV cache and the batch metadata; a Model owns only its weights.
// Forward is called by one thread at a time.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "kernels/backend.h"
#include "model/config.h"

namespace corolla {

class Communicator;  // parallel/communicator.h

// How a model is split over ranks (parallel/): attention heads and dense layers tensor-parallel
// over tp_size ranks, experts expert-parallel over ep_size ranks. TP-EP (ep_size = tp_size):
// the same ranks, tokens replicated. DP-EP (ep_size = dp_size x tp_size, dp_size > 1): each DP
// rank owns its tokens and KV cache, and the MoE layers move tokens to the experts' ranks and
// back (parallel/expert_parallel.h); a Forward with an empty batch (token_ids [0]) then runs only
// those exchanges, so a rank without requests still takes part in the others' step.
// The default is one rank holding everything.
struct ModelShard {
  int tp_size = 1, tp_rank = 0;
  Communicator* tp = nullptr;  // sums row-parallel outputs; null when tp_size is 1
  int ep_size = 1, ep_rank = 0;
  Communicator* ep = nullptr;  // TP-EP: sums the MoE layers' partial outputs; DP-EP: the all-to-alls
  int dp_size = 1, dp_rank = 0;
  // DP-EP: the most tokens a rank brings to one step, for fixed-size exchanges that need no host
  // synchronisation (CUDA graphs); 0: sizes are exchanged in each MoE layer.
  // With --tp > 1 (DP x TP): the most tokens a DP replica brings; each TP rank dispatches 1/tp.
  int ep_capacity = 0;
  // TP-EP through DP-EP's exchange instead of the all-reduce of replicated experts' partial sums
  // (COROLLA_TP_EP_EXCHANGE=1): each TP rank dispatches 1/tp of the tokens over the TP group and
  // the TP all-reduce assembles the outputs, the MoE path of DP x TP on tp ranks (a check of
  // that path on fewer GPUs than dp x tp).
  bool tp_ep_exchange = false;
  // DP-EP with ep_capacity > 0: also a sized exchange, which a forward takes unless its batch
  // says ep_fixed_capacity (serving: steps in which every rank brings at most ep_capacity tokens,
  // the decode graphs among them, take the fixed one; the others, prefills, the sized one).
  bool ep_sized_fallback = false;
  bool dp_ep() const { return dp_size > 1 && ep_size > tp_size; }
  // The MoE layers move tokens with an EpExchange (DP-EP, or TP-EP with tp_ep_exchange).
  bool uses_ep_exchange() const { return dp_ep() || (tp_ep_exchange && tp_size > 1 && ep_size == tp_size); }
};

// The expert layouts the MoE models accept, the same for every family: TP-EP (--ep = --tp) or
// DP-EP (--dp > 1, --ep = --dp x --tp: the experts over all ranks; with --tp > 1 attention and
// dense layers stay tensor-parallel inside each DP replica). Errors name `model_type` and the
// flags.
Status CheckExpertLayout(const ModelShard& shard, const std::string& model_type, bool has_experts);

// The per-sequence state of one linear-attention layer, indexed by state slot (under tensor
// parallelism, of this rank's channels and heads only).
struct LinearStateView {
  TensorView conv;       // [slots, C, K-1] f32: the last K-1 inputs of the causal conv
  TensorView recurrent;  // [slots, Hv, Dk, Dv] f32 or bf16 (StateSpec::recurrent_dtype): the delta-rule state
};

// One step's inputs, all on the backend's device.
struct ForwardBatch {
  TensorView token_ids;    // [T] i32
  TensorView positions;    // [T] i32
  AttentionBatch attention;
  TensorView logits_rows;  // [N] i32: rows of the flat batch whose logits are computed
  // Hybrid models: each sequence's state slot [B] i32, and the states of the linear layers.
  TensorView state_slots{};
  std::span<const LinearStateView> linear_states{};
  // DP-EP models with both exchanges (ModelShard::ep_sized_fallback): this forward's exchanges
  // take the fixed-capacity one. Every rank's forward of one step must say the same (the
  // exchanges are collective); models with one exchange ignore it.
  bool ep_fixed_capacity = false;
};

// What the engine must allocate for the model's paged KV cache.
struct KvCacheSpec {
  int num_layers = 0;  // layers with a paged KV cache
  int num_kv_heads = 0;
  int head_dim = 0;
  // MLA: one tensor per layer (the compressed latent) serves as both K and V.
  bool shared_kv = false;
};

// What the engine must allocate for the model's per-sequence linear-attention states (this
// rank's part under tensor parallelism).
struct StateSpec {
  int num_layers = 0;  // linear-attention layers (0: none)
  int conv_channels = 0;
  int conv_history = 0;  // kernel - 1
  int num_heads = 0;     // value heads
  int key_dim = 0;
  int value_dim = 0;
  // The delta-rule state's storage; the math stays f32. bf16 halves the state's memory and
  // traffic at an accuracy cost (BENCHMARKS.md); models ask for f32, the engine's user chooses
  // (--linear-state-dtype). The conv state is always f32.
  DType recurrent_dtype = DType::kF32;
  StateSpec WithRecurrentDtype(DType dtype) const {
    StateSpec spec = *this;
    spec.recurrent_dtype = dtype;
    return spec;
  }
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual KvCacheSpec kv_cache_spec() const = 0;
  virtual StateSpec state_spec() const { return {}; }
  // Runs the batch; writes this step's K/V into `kv_caches` (one per KV layer) and logits
  // [N, vocab] (float32) for batch.logits_rows.
  virtual void Forward(const ForwardBatch& batch, std::span<const KvCacheView> kv_caches,
                       const TensorView& logits) = 0;
};

// Loads the Hugging Face checkpoint in `dir` onto `backend` (which must outlive the model).
// With a shard, only this rank's part of each weight is read; the communicators must outlive
// the model too.
Result<std::unique_ptr<Model>> LoadModel(const std::string& dir, Backend& backend, const ModelShard& shard = {});

}  // namespace corolla
