// WeightLoader: takes tensors by name from a Checkpoint into a Backend's storage, checking each
// shape, and remembers what was taken so the load can end with an error naming every tensor
// the checkpoint holds that the model does not use. Every error names the tensor, what was
// expected and what was found. Block-scaled FP8 weights (`X.weight` F8_E4M3 with
// `X.weight_scale_inv`, one f32 scale per block) are dequantised on the host before upload.
// Used by one thread during load.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/safetensors.h"

namespace corolla {

class WeightLoader {
 public:
  WeightLoader(const Checkpoint& checkpoint, Backend& backend)
      : checkpoint_(checkpoint), backend_(backend) {}
  // Block shape of FP8 weight scales (DeepSeek: 128 x 128).
  void set_fp8_block(int rows, int cols) {
    fp8_block_rows_ = rows;
    fp8_block_cols_ = cols;
  }

  bool Has(const std::string& name) const { return checkpoint_.Has(name); }
  // Loads `name`, which must have shape `expected` and a float dtype (bf16, f16, f32).
  Result<Tensor> Load(const std::string& name, const Shape& expected);
  // `name` as a host f32 tensor (widened or dequantised), for weights the model derives others from.
  Result<Tensor> LoadHost(const std::string& name, const Shape& expected);
  // Loads several tensors concatenated along dim 0 (fused projections such as q|k|v).
  Result<Tensor> LoadConcat(const std::vector<std::string>& names, const std::vector<Shape>& expected);
  // Stacked expert weights [E, rows, cols]. `prefix` is e.g. "model.layers.3.mlp.experts.".
  // gate_up: [E, 2I, H] from per-expert `E.gate_proj.weight` + `E.up_proj.weight`, or the fused
  // `gate_up_proj` ([E, 2I, H]). down: [E, H, I] from `E.down_proj.weight` or fused `down_proj`.
  Result<Tensor> LoadExpertsGateUp(const std::string& prefix, int num_experts, int inter, int hidden);
  Result<Tensor> LoadExpertsDown(const std::string& prefix, int num_experts, int inter, int hidden);

  // Error listing checkpoint tensors never loaded, except those `ignore` accepts.
  Status CheckAllUsed(const std::function<bool(const std::string&)>& ignore) const;

 private:
  // The host view of `name`, dequantised to f32 into scratch_ when it is FP8.
  Result<TensorView> Find(const std::string& name, const Shape& expected);
  Result<TensorView> DequantizeFp8(const std::string& name, const TensorView& w);

  const Checkpoint& checkpoint_;
  Backend& backend_;
  std::set<std::string> used_;
  int fp8_block_rows_ = 128;
  int fp8_block_cols_ = 128;
  std::vector<Tensor> scratch_;  // dequantised weights until the current Load* returns
};

}  // namespace corolla
