#include "model/config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace corolla {

using nlohmann::json;

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": cannot open");
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return Corrupt(path + ": read error");
  return s.str();
}

Result<json> ParseJson(const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    try {
      [[maybe_unused]] const json again = json::parse(text);  // throws, naming where it fails
    } catch (const json::parse_error& e) {
      return Corrupt(what + ": invalid JSON: " + e.what());
    }
    return Corrupt(what + ": invalid JSON");
  }
  return j;
}

namespace {

// Typed field readers: absent keys keep the default; wrong types are errors naming the key.
class Fields {
 public:
  explicit Fields(const json& j) : j_(j) {}

  Status Int(const char* key, int* out, bool required = false) {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return Missing(key, required);
    if (!it->is_number_integer()) return Bad(key, "an integer");
    int64_t v = it->get<int64_t>();
    if (v < INT32_MIN || v > INT32_MAX) return Bad(key, "a 32-bit integer");
    *out = static_cast<int>(v);
    return Status::Ok();
  }
  Status Double(const char* key, double* out, bool required = false) {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return Missing(key, required);
    if (!it->is_number()) return Bad(key, "a number");
    *out = it->get<double>();
    return Status::Ok();
  }
  Status Bool(const char* key, bool* out) {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return Status::Ok();
    if (!it->is_boolean()) return Bad(key, "true or false");
    *out = it->get<bool>();
    return Status::Ok();
  }
  // An int or a list of ints (eos_token_id is either).
  Status IntList(const char* key, std::vector<int>* out) {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return Status::Ok();
    out->clear();
    if (it->is_number_integer()) {
      out->push_back(it->get<int>());
      return Status::Ok();
    }
    if (!it->is_array()) return Bad(key, "an integer or a list of integers");
    for (const auto& v : *it) {
      if (!v.is_number_integer()) return Bad(key, "a list of integers");
      out->push_back(v.get<int>());
    }
    return Status::Ok();
  }

 private:
  Status Missing(const char* key, bool required) {
    if (!required) return Status::Ok();
    return InvalidArgument(std::string("config.json: required field '") + key + "' is missing");
  }
  Status Bad(const char* key, const char* expected) {
    return InvalidArgument(std::string("config.json: field '") + key + "' must be " + expected +
                           ", got " + j_.at(key).dump());
  }
  const json& j_;
};

Status ParseRope(const json& j, ModelConfig* c) {
  // transformers >= 5 writes rope_parameters {rope_theta, rope_type, partial_rotary_factor, ...};
  // earlier checkpoints write rope_theta + rope_scaling {type|rope_type, factor, ...}.
  Fields top(j);
  RETURN_IF_ERROR(top.Double("rope_theta", &c->rope.theta));
  RETURN_IF_ERROR(top.Double("partial_rotary_factor", &c->rope.partial_rotary_factor));
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object()) return InvalidArgument(std::string("config.json: ") + key + " must be an object");
    Fields f(*it);
    RETURN_IF_ERROR(f.Double("rope_theta", &c->rope.theta));
    RETURN_IF_ERROR(f.Double("partial_rotary_factor", &c->rope.partial_rotary_factor));
    RETURN_IF_ERROR(f.Double("factor", &c->rope.factor));
    RETURN_IF_ERROR(f.Int("original_max_position_embeddings", &c->rope.original_max_position_embeddings));
    RETURN_IF_ERROR(f.Double("beta_fast", &c->rope.beta_fast));
    RETURN_IF_ERROR(f.Double("beta_slow", &c->rope.beta_slow));
    RETURN_IF_ERROR(f.Double("mscale", &c->rope.mscale));
    RETURN_IF_ERROR(f.Double("mscale_all_dim", &c->rope.mscale_all_dim));
    for (const char* type_key : {"rope_type", "type"}) {
      auto t = it->find(type_key);
      if (t != it->end() && t->is_string()) c->rope.type = t->get<std::string>();
    }
  }
  if (c->rope.type == "yarn") {
    // As transformers does: with original_max_position_embeddings, the factor is the ratio of
    // the context lengths; without, the original length is max_position_embeddings.
    if (c->rope.original_max_position_embeddings > 0 && c->max_position_embeddings > 0) {
      c->rope.factor = static_cast<double>(c->max_position_embeddings) / c->rope.original_max_position_embeddings;
    } else {
      c->rope.original_max_position_embeddings = c->max_position_embeddings;
    }
  } else if (c->rope.type != "default") {
    return Unsupported("config.json: rope type '" + c->rope.type + "' is not supported for " +
                       c->model_type);
  }
  if (c->rope.theta <= 0) return InvalidArgument("config.json: rope_theta must be positive");
  if (c->rope.partial_rotary_factor <= 0 || c->rope.partial_rotary_factor > 1)
    return InvalidArgument("config.json: partial_rotary_factor must be in (0, 1]");
  return Status::Ok();
}

// Fields every family spells the same way.
Status ParseCommon(const json& j, ModelConfig* c) {
  Fields f(j);
  RETURN_IF_ERROR(f.Double("rms_norm_eps", &c->rms_norm_eps));
  RETURN_IF_ERROR(f.Int("max_position_embeddings", &c->max_position_embeddings, true));
  RETURN_IF_ERROR(f.Bool("tie_word_embeddings", &c->tie_word_embeddings));
  RETURN_IF_ERROR(f.Bool("attention_bias", &c->attention_bias));
  RETURN_IF_ERROR(f.IntList("eos_token_id", &c->eos_token_ids));
  int bos = -1;
  RETURN_IF_ERROR(f.Int("bos_token_id", &bos));
  if (bos >= 0) c->bos_token_id = bos;
  return Status::Ok();
}

// Qwen3.5 / Qwen3-Next: which layers are Gated DeltaNet, their sizes, the shared expert.
Status ParseHybrid(const json& j, ModelConfig* c) {
  Fields f(j);
  LinearAttentionConfig& la = c->linear;
  RETURN_IF_ERROR(f.Int("linear_num_key_heads", &la.num_key_heads, true));
  RETURN_IF_ERROR(f.Int("linear_num_value_heads", &la.num_value_heads, true));
  RETURN_IF_ERROR(f.Int("linear_key_head_dim", &la.key_head_dim, true));
  RETURN_IF_ERROR(f.Int("linear_value_head_dim", &la.value_head_dim, true));
  RETURN_IF_ERROR(f.Int("linear_conv_kernel_dim", &la.conv_kernel));
  RETURN_IF_ERROR(f.Int("shared_expert_intermediate_size", &c->shared_expert_intermediate_size));
  c->attention_output_gate = true;
  RETURN_IF_ERROR(f.Bool("attn_output_gate", &c->attention_output_gate));
  c->zero_centered_norm = true;
  if (la.num_key_heads <= 0 || la.num_value_heads <= 0 || la.key_head_dim <= 0 || la.value_head_dim <= 0 ||
      la.conv_kernel < 1 || la.num_value_heads % la.num_key_heads != 0)
    return InvalidArgument("config.json: linear attention sizes must be positive and linear_num_value_heads a "
                           "multiple of linear_num_key_heads");
  if (auto it = j.find("layer_types"); it != j.end() && it->is_array()) {
    if (static_cast<int>(it->size()) != c->num_layers)
      return InvalidArgument("config.json: layer_types has " + std::to_string(it->size()) + " entries for " +
                             std::to_string(c->num_layers) + " layers");
    for (int l = 0; l < c->num_layers; ++l) {
      const json& t = (*it)[l];
      std::string kind = t.is_string() ? t.get<std::string>() : "";
      if (kind == "linear_attention") {
        c->layer_kinds[l] = LayerKind::kLinearAttention;
      } else if (kind != "full_attention") {
        return Unsupported("config.json: layer type " + t.dump() + " is not supported");
      }
    }
  } else {
    int interval = 4;
    RETURN_IF_ERROR(f.Int("full_attention_interval", &interval));
    if (interval <= 0) return InvalidArgument("config.json: full_attention_interval must be positive");
    for (int l = 0; l < c->num_layers; ++l)
      c->layer_kinds[l] = (l + 1) % interval == 0 ? LayerKind::kFullAttention : LayerKind::kLinearAttention;
  }
  return Status::Ok();
}

Status ParseQwen3(const json& j, ModelConfig* c) {
  Fields f(j);
  RETURN_IF_ERROR(f.Int("vocab_size", &c->vocab_size, true));
  RETURN_IF_ERROR(f.Int("hidden_size", &c->hidden_size, true));
  RETURN_IF_ERROR(f.Int("num_hidden_layers", &c->num_layers, true));
  RETURN_IF_ERROR(f.Int("num_attention_heads", &c->num_attention_heads, true));
  c->num_kv_heads = c->num_attention_heads;
  RETURN_IF_ERROR(f.Int("num_key_value_heads", &c->num_kv_heads));
  if (c->num_attention_heads > 0) c->head_dim = c->hidden_size / c->num_attention_heads;
  RETURN_IF_ERROR(f.Int("head_dim", &c->head_dim));
  RETURN_IF_ERROR(f.Int("intermediate_size", &c->intermediate_size));
  RETURN_IF_ERROR(ParseCommon(j, c));
  RETURN_IF_ERROR(ParseRope(j, c));

  if (c->family == ModelFamily::kQwen3Moe || c->family == ModelFamily::kQwen3Hybrid) {
    // Hub checkpoints say num_experts; transformers >= 5 writes num_local_experts.
    RETURN_IF_ERROR(f.Int("num_experts", &c->num_experts));
    RETURN_IF_ERROR(f.Int("num_local_experts", &c->num_experts));
    RETURN_IF_ERROR(f.Int("num_experts_per_tok", &c->num_experts_per_token, true));
    RETURN_IF_ERROR(f.Int("moe_intermediate_size", &c->moe_intermediate_size, true));
    RETURN_IF_ERROR(f.Bool("norm_topk_prob", &c->norm_topk_prob));
    RETURN_IF_ERROR(f.Int("decoder_sparse_step", &c->decoder_sparse_step));
    RETURN_IF_ERROR(f.IntList("mlp_only_layers", &c->mlp_only_layers));
    if (c->num_experts <= 0) return InvalidArgument("config.json: num_experts must be positive");
    if (c->num_experts_per_token <= 0 || c->num_experts_per_token > c->num_experts)
      return InvalidArgument("config.json: num_experts_per_tok must be in [1, num_experts]");
    if (c->decoder_sparse_step <= 0)
      return InvalidArgument("config.json: decoder_sparse_step must be positive");
  }

  c->layer_kinds.assign(std::max(c->num_layers, 0), LayerKind::kFullAttention);
  if (c->family == ModelFamily::kQwen3Hybrid) {
    RETURN_IF_ERROR(ParseHybrid(j, c));
  } else if (auto it = j.find("layer_types"); it != j.end() && it->is_array()) {
    // Only full attention in the other families; layer_types, if given, must agree.
    for (const auto& t : *it) {
      if (!t.is_string() || t.get<std::string>() != "full_attention")
        return Unsupported("config.json: layer type " + t.dump() + " is not supported for " +
                           c->model_type);
    }
  }
  if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->num_layers <= 0 ||
      c->num_attention_heads <= 0 || c->num_kv_heads <= 0 || c->head_dim <= 0 ||
      c->max_position_embeddings <= 0)
    return InvalidArgument("config.json: sizes must be positive");
  if (c->num_attention_heads % c->num_kv_heads != 0)
    return InvalidArgument("config.json: num_attention_heads (" +
                           std::to_string(c->num_attention_heads) +
                           ") must be a multiple of num_key_value_heads (" +
                           std::to_string(c->num_kv_heads) + ")");
  if (c->head_dim % 2 != 0) return InvalidArgument("config.json: head_dim must be even");
  if (c->family == ModelFamily::kQwen3 && c->intermediate_size <= 0)
    return InvalidArgument("config.json: intermediate_size must be positive");
  return Status::Ok();
}

Status ParseDeepseekV3(const json& j, ModelConfig* c) {
  Fields f(j);
  RETURN_IF_ERROR(f.Int("vocab_size", &c->vocab_size, true));
  RETURN_IF_ERROR(f.Int("hidden_size", &c->hidden_size, true));
  RETURN_IF_ERROR(f.Int("num_hidden_layers", &c->num_layers, true));
  RETURN_IF_ERROR(f.Int("num_attention_heads", &c->num_attention_heads, true));
  RETURN_IF_ERROR(f.Int("intermediate_size", &c->intermediate_size, true));
  RETURN_IF_ERROR(ParseCommon(j, c));

  MlaConfig& m = c->mla;
  RETURN_IF_ERROR(f.Int("q_lora_rank", &m.q_lora_rank));  // null: no query bottleneck
  RETURN_IF_ERROR(f.Int("kv_lora_rank", &m.kv_lora_rank, true));
  RETURN_IF_ERROR(f.Int("qk_nope_head_dim", &m.qk_nope_head_dim, true));
  RETURN_IF_ERROR(f.Int("qk_rope_head_dim", &m.qk_rope_head_dim, true));
  RETURN_IF_ERROR(f.Int("v_head_dim", &m.v_head_dim, true));
  c->rope.interleaved = true;
  RETURN_IF_ERROR(f.Bool("rope_interleave", &c->rope.interleaved));
  // RoPE covers the rope part of each head; the cache holds one latent "head" per token.
  c->head_dim = m.qk_rope_head_dim;
  c->num_kv_heads = 1;
  RETURN_IF_ERROR(ParseRope(j, c));

  RETURN_IF_ERROR(f.Int("n_routed_experts", &c->num_experts, true));
  RETURN_IF_ERROR(f.Int("num_experts_per_tok", &c->num_experts_per_token, true));
  RETURN_IF_ERROR(f.Int("moe_intermediate_size", &c->moe_intermediate_size, true));
  RETURN_IF_ERROR(f.Bool("norm_topk_prob", &c->norm_topk_prob));
  RETURN_IF_ERROR(f.Int("first_k_dense_replace", &c->first_k_dense_replace));
  RETURN_IF_ERROR(f.Int("n_group", &c->num_expert_groups));
  RETURN_IF_ERROR(f.Int("topk_group", &c->topk_groups));
  RETURN_IF_ERROR(f.Double("routed_scaling_factor", &c->routed_scaling_factor));
  RETURN_IF_ERROR(f.Int("n_shared_experts", &c->num_shared_experts));
  RETURN_IF_ERROR(f.Int("num_nextn_predict_layers", &c->num_nextn_predict_layers));
  c->scoring_func = "sigmoid";
  if (auto it = j.find("scoring_func"); it != j.end() && it->is_string()) c->scoring_func = it->get<std::string>();
  if (c->scoring_func != "sigmoid" && c->scoring_func != "softmax")
    return Unsupported("config.json: scoring_func '" + c->scoring_func + "' is not supported");
  if (auto it = j.find("topk_method"); it != j.end() && it->is_string()) {
    std::string method = it->get<std::string>();
    if (method != "noaux_tc" && method != "group_limited_greedy" && method != "greedy")
      return Unsupported("config.json: topk_method '" + method + "' is not supported");
  }
  if (auto it = j.find("quantization_config"); it != j.end() && it->is_object()) {
    auto qm = it->find("quant_method");
    c->quant.method = qm != it->end() && qm->is_string() ? qm->get<std::string>() : "";
    if (c->quant.method != "fp8")
      return Unsupported("config.json: quant_method '" + c->quant.method + "' is not supported (fp8 is)");
    if (auto fmt = it->find("fmt"); fmt != it->end() && fmt->is_string() && fmt->get<std::string>() != "e4m3")
      return Unsupported("config.json: fp8 format " + fmt->dump() + " is not supported (e4m3 is)");
    if (auto bs = it->find("weight_block_size"); bs != it->end()) {
      if (!bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() || !(*bs)[1].is_number_integer() ||
          (*bs)[0].get<int>() <= 0 || (*bs)[1].get<int>() <= 0)
        return InvalidArgument("config.json: weight_block_size must be two positive integers");
      c->quant.block_rows = (*bs)[0].get<int>();
      c->quant.block_cols = (*bs)[1].get<int>();
    }
  }
  c->layer_kinds.assign(std::max(c->num_layers, 0), LayerKind::kFullAttention);
  if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->num_layers <= 0 || c->num_attention_heads <= 0 ||
      m.kv_lora_rank <= 0 || m.qk_rope_head_dim <= 0 || m.qk_rope_head_dim % 2 != 0 || m.v_head_dim <= 0 ||
      m.qk_nope_head_dim < 0 || m.q_lora_rank < 0 || c->max_position_embeddings <= 0)
    return InvalidArgument("config.json: sizes must be positive (and qk_rope_head_dim even)");
  if (c->num_experts <= 0 || c->num_experts_per_token <= 0 || c->num_experts_per_token > c->num_experts)
    return InvalidArgument("config.json: num_experts_per_tok must be in [1, n_routed_experts]");
  if (c->num_expert_groups <= 0 || c->num_experts % c->num_expert_groups != 0 || c->topk_groups <= 0 ||
      c->topk_groups > c->num_expert_groups)
    return InvalidArgument("config.json: n_group must divide n_routed_experts and topk_group be in [1, n_group]");
  if (c->num_experts_per_token > c->topk_groups * (c->num_experts / c->num_expert_groups))
    return InvalidArgument("config.json: num_experts_per_tok exceeds the experts of topk_group groups");
  return Status::Ok();
}

}  // namespace

bool ModelConfig::is_moe_layer(int layer) const {
  if (num_experts == 0 || layer < first_k_dense_replace) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end())
    return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

int ModelConfig::num_linear_layers() const {
  // Only the first num_layers count: benchmarks truncate depth by lowering num_layers.
  const auto end = layer_kinds.begin() + std::min<size_t>(layer_kinds.size(), std::max(num_layers, 0));
  return static_cast<int>(std::count(layer_kinds.begin(), end, LayerKind::kLinearAttention));
}

int ModelConfig::rotary_dim() const {
  int d = static_cast<int>(head_dim * rope.partial_rotary_factor);
  return d - d % 2;
}

Result<ModelConfig> ParseModelConfig(const json& root) {
  if (!root.is_object()) return InvalidArgument("config.json: not a JSON object");
  ModelConfig c;
  const json* j = &root;
  // Multimodal wrappers keep the language model's config in text_config and its weights under
  // model.language_model.
  if (auto it = root.find("text_config"); it != root.end() && it->is_object()) {
    j = &*it;
    c.weight_prefix = "model.language_model.";
  }
  auto mt = j->find("model_type");
  if (mt == j->end() || !mt->is_string()) {
    mt = root.find("model_type");
    if (mt == root.end() || !mt->is_string())
      return InvalidArgument("config.json: required field 'model_type' is missing");
  }
  c.model_type = mt->get<std::string>();
  if (c.model_type == "qwen3") {
    c.family = ModelFamily::kQwen3;
  } else if (c.model_type == "qwen3_moe") {
    c.family = ModelFamily::kQwen3Moe;
  } else if (c.model_type == "qwen3_5_moe_text" || c.model_type == "qwen3_5_moe" || c.model_type == "qwen3_next") {
    c.family = ModelFamily::kQwen3Hybrid;
  } else if (c.model_type == "deepseek_v3") {
    c.family = ModelFamily::kDeepseekV3;
  } else {
    return Unsupported("config.json: model_type '" + c.model_type +
                       "' is not supported (supported: qwen3, qwen3_moe, qwen3_5_moe, qwen3_5_moe_text, qwen3_next, deepseek_v3)");
  }
  RETURN_IF_ERROR(c.family == ModelFamily::kDeepseekV3 ? ParseDeepseekV3(*j, &c) : ParseQwen3(*j, &c));
  if (c.eos_token_ids.empty() && j != &root) RETURN_IF_ERROR(Fields(root).IntList("eos_token_id", &c.eos_token_ids));
  return c;
}

Result<ModelConfig> LoadModelConfig(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(dir + "/config.json"));
  ASSIGN_OR_RETURN(json j, ParseJson(text, dir + "/config.json"));
  Result<ModelConfig> c = ParseModelConfig(j);
  if (!c.ok()) return c.status().WithContext(dir);
  return c;
}

Result<GenerationConfig> LoadGenerationConfig(const std::string& dir, const ModelConfig& model) {
  GenerationConfig g;
  g.eos_token_ids = model.eos_token_ids;
  std::string path = dir + "/generation_config.json";
  Result<std::string> text = ReadFile(path);
  if (!text.ok()) return g;  // optional file
  ASSIGN_OR_RETURN(json j, ParseJson(*text, path));
  if (!j.is_object()) return InvalidArgument(path + ": not a JSON object");
  Fields f(j);
  std::vector<int> eos;
  Status s = f.IntList("eos_token_id", &eos);
  if (!s.ok()) return s.WithContext(path);
  if (!eos.empty()) g.eos_token_ids = eos;
  // Sampling defaults are optional; a value of the wrong type is ignored as transformers does.
  auto number = [&](const char* key) -> std::optional<double> {
    auto it = j.find(key);
    if (it != j.end() && it->is_number()) return it->get<double>();
    return std::nullopt;
  };
  g.temperature = number("temperature");
  g.top_p = number("top_p");
  g.min_p = number("min_p");
  if (auto k = number("top_k")) g.top_k = static_cast<int>(*k);
  if (auto it = j.find("do_sample"); it != j.end() && it->is_boolean()) g.do_sample = it->get<bool>();
  return g;
}

}  // namespace corolla
