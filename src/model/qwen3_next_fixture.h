// Tests only: a Qwen3-Next checkpoint made from a Qwen3.5 hybrid one by rewriting its Gated
// DeltaNet projections in Qwen3-Next's fused per-key-head layout (in_proj_qkvz, in_proj_ba) and
// its model_type. Same weights, so the two must give the same logits. Header-only, so that the
// test binaries of several folders can share it without a library.
#pragma once

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/safetensors.h"

namespace corolla {

// Writes `out_dir`/config.json and model.safetensors from the Qwen3.5 hybrid in `qwen35_dir`
// (bf16 weights). `out_dir` must exist.
inline Status WriteQwen3NextFixture(const std::string& qwen35_dir, const std::string& out_dir) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(qwen35_dir + "/config.json"));
  nlohmann::json config = nlohmann::json::parse(text);
  config["model_type"] = "qwen3_next";
  std::ofstream(out_dir + "/config.json") << config.dump();
  const int64_t hk = config["linear_num_key_heads"], hv = config["linear_num_value_heads"];
  const int64_t dk = config["linear_key_head_dim"], dv = config["linear_value_head_dim"];
  const int64_t hidden = config["hidden_size"], r = hv / hk, kd = hk * dk, vd = hv * dv;

  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                   SafetensorsFile::Open(qwen35_dir + "/model.safetensors"));
  std::vector<Tensor> keep;
  std::vector<std::pair<std::string, TensorView>> out;
  const int64_t row_bytes = hidden * 2;  // bf16
  for (const auto& e : file->entries()) {
    const std::string& name = e.name;
    const auto pos = name.find("linear_attn.in_proj_");
    if (pos == std::string::npos) {
      out.emplace_back(name, file->View(e));
      continue;
    }
    const std::string prefix = name.substr(0, pos + 12);  // "...linear_attn."
    if (name != prefix + "in_proj_qkv.weight") continue;  // z, b, a are folded in below
    auto rows = [&](const std::string& n) {
      return static_cast<const char*>(file->View(*file->Find(prefix + n)).data);
    };
    const char *qkv = rows("in_proj_qkv.weight"), *z = rows("in_proj_z.weight");
    const char *b = rows("in_proj_b.weight"), *a = rows("in_proj_a.weight");
    // Per key head g: in_proj_qkvz rows [q (Dk) | k (Dk) | v (r Dv) | z (r Dv)], in_proj_ba [b (r)
    // | a (r)].
    Tensor qkvz = Tensor::Empty(DType::kBF16, {2 * kd + 2 * vd, hidden});
    Tensor ba = Tensor::Empty(DType::kBF16, {2 * hv, hidden});
    char* dst = static_cast<char*>(qkvz.view().data);
    char* dst_ba = static_cast<char*>(ba.view().data);
    for (int64_t g = 0; g < hk; ++g) {
      auto put = [&](const char* from, int64_t row, int64_t n) {
        std::memcpy(dst, from + row * row_bytes, n * row_bytes);
        dst += n * row_bytes;
      };
      put(qkv, g * dk, dk);
      put(qkv, kd + g * dk, dk);
      put(qkv, 2 * kd + g * r * dv, r * dv);
      put(z, g * r * dv, r * dv);
      std::memcpy(dst_ba, b + g * r * row_bytes, r * row_bytes);
      std::memcpy(dst_ba + r * row_bytes, a + g * r * row_bytes, r * row_bytes);
      dst_ba += 2 * r * row_bytes;
    }
    keep.push_back(qkvz);
    keep.push_back(ba);
    out.emplace_back(prefix + "in_proj_qkvz.weight", qkvz.view());
    out.emplace_back(prefix + "in_proj_ba.weight", ba.view());
  }
  return WriteSafetensors(out_dir + "/model.safetensors", out);
}

}  // namespace corolla
