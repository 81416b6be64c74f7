#include "model/random_weights.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "base/numeric.h"
#include "model/deepseek_v3.h"
#include "model/qwen3.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace corolla {
namespace {

// The (name, shape) of every tensor a Qwen3 / Qwen3-MoE / Qwen3.5-hybrid checkpoint of `c`
// holds (the hybrid in Qwen3.5's unfused layout, which Qwen3-Next configs load too).
std::vector<std::pair<std::string, Shape>> Qwen3Tensors(const ModelConfig& c) {
  const int64_t h = c.hidden_size, d = c.head_dim;
  const std::string& root = c.weight_prefix;
  std::vector<std::pair<std::string, Shape>> t;
  t.push_back({root + "embed_tokens.weight", {c.vocab_size, h}});
  t.push_back({root + "norm.weight", {h}});
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {c.vocab_size, h}});
  const LinearAttentionConfig& la = c.linear;
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = root + "layers." + std::to_string(l) + ".";
    t.push_back({p + "input_layernorm.weight", {h}});
    t.push_back({p + "post_attention_layernorm.weight", {h}});
    if (!c.layer_kinds.empty() && c.layer_kinds[l] == LayerKind::kLinearAttention) {
      const std::string a = p + "linear_attn.";
      t.push_back({a + "in_proj_qkv.weight", {la.conv_channels(), h}});
      t.push_back({a + "in_proj_z.weight", {la.value_dim(), h}});
      t.push_back({a + "in_proj_b.weight", {la.num_value_heads, h}});
      t.push_back({a + "in_proj_a.weight", {la.num_value_heads, h}});
      t.push_back({a + "conv1d.weight", {la.conv_channels(), 1, la.conv_kernel}});
      t.push_back({a + "A_log", {la.num_value_heads}});
      t.push_back({a + "dt_bias", {la.num_value_heads}});
      t.push_back({a + "norm.weight", {la.value_head_dim}});
      t.push_back({a + "out_proj.weight", {h, la.value_dim()}});
    } else {
      t.push_back({p + "self_attn.q_proj.weight", {c.q_size() * (c.attention_output_gate ? 2 : 1), h}});
      t.push_back({p + "self_attn.k_proj.weight", {c.kv_size(), h}});
      t.push_back({p + "self_attn.v_proj.weight", {c.kv_size(), h}});
      t.push_back({p + "self_attn.o_proj.weight", {h, c.q_size()}});
      t.push_back({p + "self_attn.q_norm.weight", {d}});
      t.push_back({p + "self_attn.k_norm.weight", {d}});
    }
    if (c.is_moe_layer(l)) {
      const int64_t e = c.num_experts, inter = c.moe_intermediate_size;
      t.push_back({p + "mlp.gate.weight", {e, h}});
      t.push_back({p + "mlp.experts.gate_up_proj", {e, 2 * inter, h}});
      t.push_back({p + "mlp.experts.down_proj", {e, h, inter}});
      if (c.shared_expert_intermediate_size > 0) {
        const int64_t si = c.shared_expert_intermediate_size;
        t.push_back({p + "mlp.shared_expert.gate_proj.weight", {si, h}});
        t.push_back({p + "mlp.shared_expert.up_proj.weight", {si, h}});
        t.push_back({p + "mlp.shared_expert.down_proj.weight", {h, si}});
        t.push_back({p + "mlp.shared_expert_gate.weight", {1, h}});
      }
    } else {
      const int64_t inter = c.intermediate_size;
      t.push_back({p + "mlp.gate_proj.weight", {inter, h}});
      t.push_back({p + "mlp.up_proj.weight", {inter, h}});
      t.push_back({p + "mlp.down_proj.weight", {h, inter}});
    }
  }
  return t;
}

// The same for DeepSeek-V3. per_expert: routed experts as `experts.E.{gate,up,down}_proj.weight`
// (an FP8 checkpoint's layout), else fused [E, ...] tensors.
std::vector<std::pair<std::string, Shape>> DeepseekTensors(const ModelConfig& c, bool per_expert) {
  const int64_t h = c.hidden_size, heads = c.num_attention_heads;
  const MlaConfig& m = c.mla;
  const std::string& root = c.weight_prefix;
  std::vector<std::pair<std::string, Shape>> t;
  t.push_back({root + "embed_tokens.weight", {c.vocab_size, h}});
  t.push_back({root + "norm.weight", {h}});
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {c.vocab_size, h}});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = root + "layers." + std::to_string(l) + ".", a = p + "self_attn.", f = p + "mlp.";
    t.push_back({p + "input_layernorm.weight", {h}});
    t.push_back({p + "post_attention_layernorm.weight", {h}});
    if (m.q_lora_rank > 0) {
      t.push_back({a + "q_a_proj.weight", {m.q_lora_rank, h}});
      t.push_back({a + "q_a_layernorm.weight", {m.q_lora_rank}});
      t.push_back({a + "q_b_proj.weight", {heads * m.qk_head_dim(), m.q_lora_rank}});
    } else {
      t.push_back({a + "q_proj.weight", {heads * m.qk_head_dim(), h}});
    }
    t.push_back({a + "kv_a_proj_with_mqa.weight", {m.kv_lora_rank + m.qk_rope_head_dim, h}});
    t.push_back({a + "kv_a_layernorm.weight", {m.kv_lora_rank}});
    t.push_back({a + "kv_b_proj.weight", {heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank}});
    t.push_back({a + "o_proj.weight", {h, heads * m.v_head_dim}});
    if (c.is_moe_layer(l)) {
      const int64_t e = c.num_experts, inter = c.moe_intermediate_size, si = inter * c.num_shared_experts;
      t.push_back({f + "gate.weight", {e, h}});
      t.push_back({f + "gate.e_score_correction_bias", {e}});
      if (per_expert) {
        for (int64_t x = 0; x < e; ++x) {
          const std::string ex = f + "experts." + std::to_string(x) + ".";
          t.push_back({ex + "gate_proj.weight", {inter, h}});
          t.push_back({ex + "up_proj.weight", {inter, h}});
          t.push_back({ex + "down_proj.weight", {h, inter}});
        }
      } else {
        t.push_back({f + "experts.gate_up_proj", {e, 2 * inter, h}});
        t.push_back({f + "experts.down_proj", {e, h, inter}});
      }
      if (si > 0) {
        t.push_back({f + "shared_experts.gate_proj.weight", {si, h}});
        t.push_back({f + "shared_experts.up_proj.weight", {si, h}});
        t.push_back({f + "shared_experts.down_proj.weight", {h, si}});
      }
    } else {
      t.push_back({f + "gate_proj.weight", {c.intermediate_size, h}});
      t.push_back({f + "up_proj.weight", {c.intermediate_size, h}});
      t.push_back({f + "down_proj.weight", {h, c.intermediate_size}});
    }
  }
  return t;
}

bool IsNorm(const std::string& name) { return name.find("norm.weight") != std::string::npos; }
// The projections a DeepSeek-V3 FP8 checkpoint stores block-scaled (not the embedding, LM head,
// norms or router).
bool IsFp8Projection(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with("_proj.weight") || ends_with("_proj_with_mqa.weight");
}

}  // namespace

Result<std::unique_ptr<Model>> LoadModelRandom(const ModelConfig& config, Backend& backend, uint64_t seed,
                                               const ModelShard& shard) {
  const bool deepseek = config.family == ModelFamily::kDeepseekV3;
  // DeepSeek with an FP8 quantization_config and native FP8 requested: the projections in
  // block-scaled e4m3 (values U(-448, 448), scales ~ std 0.02 / 258.6, so the weights keep std
  // ~0.02) as a checkpoint holds them, so the native paths run. Otherwise bf16 (what dequant
  // would hold after the load anyway).
  bool fp8 = false;
  if (deepseek && config.quant.method == "fp8") {
    ASSIGN_OR_RETURN(fp8, NativeFp8Requested(backend));
  }
  const auto tensors = deepseek ? DeepseekTensors(config, fp8) : Qwen3Tensors(config);
  int64_t largest = 0;
  for (const auto& [name, shape] : tensors) largest = std::max(largest, shape.numel());
  // One buffer of uniform values with std 0.02 (checkpoint-like), and one of norm weights in
  // [0.9, 1.1]; each tensor views the buffer at its own pseudo-random offset.
  constexpr int64_t kSlack = int64_t{1} << 22;
  std::vector<bf16> values(largest + kSlack), norms(kSlack);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&] {  // xorshift64*: uniform in [0, 1)
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return static_cast<float>((state * 0x2545F4914F6CDD1Dull) >> 40) * (1.0f / 16777216.0f);
  };
  const float half_width = 0.02f * 1.7320508f;
  for (bf16& v : values) v = ToBf16((2.0f * next() - 1.0f) * half_width);
  for (bf16& v : norms) v = ToBf16(0.9f + 0.2f * next());
  std::vector<uint8_t> fp8_values;
  std::vector<float> fp8_scales;
  if (fp8) {
    int64_t largest_fp8 = 0;
    for (const auto& [name, shape] : tensors)
      if (IsFp8Projection(name)) largest_fp8 = std::max(largest_fp8, shape.numel());
    fp8_values.resize(largest_fp8 + kSlack);
    fp8_scales.resize(kSlack);
    for (uint8_t& v : fp8_values) v = ToFp8e4m3((2.0f * next() - 1.0f) * kFp8Max).bits;
    const float scale = 0.02f / (kFp8Max / 1.7320508f);  // std of U(-448, 448) is 448 / sqrt(3)
    for (float& v : fp8_scales) v = scale * (0.9f + 0.2f * next());
  }
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [name, shape] : tensors) {
    if (fp8 && IsFp8Projection(name)) {
      const int64_t room = static_cast<int64_t>(fp8_values.size()) - shape.numel();
      const int64_t offset = static_cast<int64_t>(next() * static_cast<float>(room)) & ~int64_t{15};
      views.push_back({name, TensorView(fp8_values.data() + offset, DType::kF8E4M3, shape, Device::kCpu, 0)});
      const Shape scale_shape{(shape[0] + kFp8Block - 1) / kFp8Block, (shape[1] + kFp8Block - 1) / kFp8Block};
      const int64_t scale_room = static_cast<int64_t>(fp8_scales.size()) - scale_shape.numel();
      const int64_t scale_offset = static_cast<int64_t>(next() * static_cast<float>(scale_room));
      views.push_back({name + "_scale_inv",
                       TensorView(fp8_scales.data() + scale_offset, DType::kF32, scale_shape, Device::kCpu, 0)});
      continue;
    }
    const bool norm = IsNorm(name);
    std::vector<bf16>& buf = norm ? norms : values;
    const int64_t room = static_cast<int64_t>(buf.size()) - shape.numel();
    const int64_t offset = static_cast<int64_t>(next() * static_cast<float>(room)) & ~int64_t{7};
    views.push_back({name, TensorView(buf.data() + offset, DType::kBF16, shape, Device::kCpu, 0)});
  }
  std::unique_ptr<Checkpoint> checkpoint = Checkpoint::FromViews("<random weights>", views);
  if (deepseek) {
    ModelConfig c = config;
    c.num_nextn_predict_layers = 0;  // no MTP weights here
    if (!fp8) c.quant = QuantConfig{};  // bf16 weights (what dequantising at load would hold)
    return LoadDeepseekV3(c, *checkpoint, backend, shard);
  }
  return LoadQwen3(config, *checkpoint, backend, shard);
}

}  // namespace corolla
