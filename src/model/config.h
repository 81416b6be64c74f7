// ModelConfig: the architecture of a checkpoint, parsed from its config.json, and
// GenerationConfig from generation_config.json. One struct covers every supported family;
// fields a family lacks keep their defaults, so an architecture is data, not a new type.
// Immutable after parsing.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace corolla {

enum class ModelFamily { kQwen3, kQwen3Moe, kQwen3Hybrid, kDeepseekV3 };

enum class LayerKind { kFullAttention, kLinearAttention };

struct RopeConfig {
  std::string type = "default";  // "default" | "yarn"
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;
  bool interleaved = false;  // rotate adjacent pairs (DeepSeek's rope_interleave)
  // YaRN.
  double factor = 1.0;
  int original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;          // 0: absent
  double mscale_all_dim = 0.0;  // 0: absent
};

// Multi-head latent attention (DeepSeek): queries through an optional low-rank bottleneck,
// keys and values from one compressed latent per token (the KV cache holds that latent).
struct MlaConfig {
  int q_lora_rank = 0;  // 0: q_proj straight from the hidden state
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// Block-scaled FP8 weights as DeepSeek publishes them (weight_scale_inv per block).
struct QuantConfig {
  std::string method;  // "" (none) or "fp8"
  int block_rows = 128;
  int block_cols = 128;
};

// Gated DeltaNet layers of the Qwen3.5 / Qwen3-Next hybrids.
struct LinearAttentionConfig {
  int num_key_heads = 0;
  int num_value_heads = 0;
  int key_head_dim = 0;
  int value_head_dim = 0;
  int conv_kernel = 4;
  int key_dim() const { return num_key_heads * key_head_dim; }
  int value_dim() const { return num_value_heads * value_head_dim; }
  int conv_channels() const { return 2 * key_dim() + value_dim(); }  // q | k | v
};

struct ModelConfig {
  std::string model_type;  // as written in config.json (text_config's for multimodal wrappers)
  ModelFamily family = ModelFamily::kQwen3;
  std::string weight_prefix = "model.";  // "model.language_model." for multimodal wrappers

  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  int num_attention_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int intermediate_size = 0;  // dense MLP width
  double rms_norm_eps = 1e-6;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  RopeConfig rope;
  std::vector<LayerKind> layer_kinds;  // [num_layers]

  // Mixture of experts (num_experts == 0: dense).
  int num_experts = 0;
  int num_experts_per_token = 0;
  int moe_intermediate_size = 0;
  bool norm_topk_prob = true;
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
  int first_k_dense_replace = 0;  // DeepSeek: the first k layers are dense
  std::string scoring_func = "softmax";  // "softmax" | "sigmoid"
  int num_expert_groups = 1;             // n_group: group-limited routing
  int topk_groups = 1;                   // topk_group
  double routed_scaling_factor = 1.0;
  int num_shared_experts = 0;            // DeepSeek: n_shared_experts x moe_intermediate_size
  int num_nextn_predict_layers = 0;      // MTP layers stored after the decoder layers

  int shared_expert_intermediate_size = 0;  // Qwen3.5: one sigmoid-gated shared expert
  bool attention_output_gate = false;       // Qwen3.5: q_proj also yields a sigmoid gate per head
  bool zero_centered_norm = false;          // Qwen3.5: RMSNorm scales by (1 + weight)
  LinearAttentionConfig linear;

  MlaConfig mla;  // kv_lora_rank > 0: the attention is MLA
  QuantConfig quant;

  std::vector<int> eos_token_ids;  // from config.json; GenerationConfig's take precedence
  std::optional<int> bos_token_id;

  bool is_moe_layer(int layer) const;
  int num_linear_layers() const;
  int rotary_dim() const;  // head_dim * partial_rotary_factor, even
  int q_size() const { return num_attention_heads * head_dim; }
  int kv_size() const { return num_kv_heads * head_dim; }
};

struct GenerationConfig {
  std::vector<int> eos_token_ids;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int> top_k;
  std::optional<double> min_p;
  std::optional<bool> do_sample;
};

// Parses config.json content. Errors name the field and the problem.
Result<ModelConfig> ParseModelConfig(const nlohmann::json& json);
// Reads DIR/config.json.
Result<ModelConfig> LoadModelConfig(const std::string& dir);
// Reads DIR/generation_config.json if present (else defaults with eos from `model`).
Result<GenerationConfig> LoadGenerationConfig(const std::string& dir, const ModelConfig& model);

// Reads a whole file; NotFound naming the path.
Result<std::string> ReadFile(const std::string& path);
// Parses JSON, Corrupt naming `what` (a file name) and the parser's message.
Result<nlohmann::json> ParseJson(const std::string& text, const std::string& what);

}  // namespace corolla
