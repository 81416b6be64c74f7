// WeightLoader: takes tensors by name from a Checkpoint into a Backend's storage, checking each
// shape, and remembers what was taken so the load can end with an error naming every tensor
// the checkpoint holds that the model does not use. Every error names the tensor, what was
// expected and what was found. Block-scaled FP8 weights (`X.weight` F8_E4M3 with
// `X.weight_scale_inv`, one f32 scale per block) are dequantised on the host before upload.
// Under tensor/expert parallelism each rank loads only its shard (Shard: a row or column range;
// an expert range) straight from the mmapped file; of an FP8 weight only the shard is
// dequantised, each element with the scale of its block in the whole tensor, so a shard may
// start or end inside a block. Used by one thread during load.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/safetensors.h"

namespace corolla {

// The part of a 2-D weight [rows, cols] one rank holds: all of it, rows [begin, end) (column-
// parallel layers: their outputs split), or columns [begin, end) (row-parallel layers: their
// inputs split, partial sums all-reduced).
struct Shard {
  int dim = -1;  // -1: whole, 0: rows, 1: columns
  int64_t begin = 0, end = 0;
  static Shard Rows(int64_t begin, int64_t end) { return {0, begin, end}; }
  static Shard Cols(int64_t begin, int64_t end) { return {1, begin, end}; }
  // Part `idx` of `parts` equal parts of `n` rows or columns.
  static Shard Part(int dim, int64_t n, int idx, int parts) { return {dim, n / parts * idx, n / parts * (idx + 1)}; }
};

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
  // With a shard, `expected` is the whole tensor's shape and only the shard is uploaded.
  Result<Tensor> Load(const std::string& name, const Shape& expected, const Shard& shard = {});
  // `name` (or its shard) as a host f32 tensor (widened or dequantised), for weights the model
  // derives others from.
  Result<Tensor> LoadHost(const std::string& name, const Shape& expected, const Shard& shard = {});
  // Loads several tensors concatenated along dim 0 (fused projections such as q|k|v).
  // `shards`: one per name, or empty for whole tensors.
  Result<Tensor> LoadConcat(const std::vector<std::string>& names, const std::vector<Shape>& expected,
                            const std::vector<Shard>& shards = {});
  // Stacked expert weights [E, rows, cols]. `prefix` is e.g. "model.layers.3.mlp.experts.".
  // gate_up: [E, 2I, H] from per-expert `E.gate_proj.weight` + `E.up_proj.weight`, or the fused
  // `gate_up_proj` ([E, 2I, H]). down: [E, H, I] from `E.down_proj.weight` or fused `down_proj`.
  // Expert parallelism: only experts [first_expert, first_expert + num_local) (num_local < 0: all)
  // are loaded, as [num_local, ...]; the others count as used.
  Result<Tensor> LoadExpertsGateUp(const std::string& prefix, int num_experts, int inter, int hidden,
                                   int first_expert = 0, int num_local = -1);
  Result<Tensor> LoadExpertsDown(const std::string& prefix, int num_experts, int inter, int hidden,
                                 int first_expert = 0, int num_local = -1);

  // Error listing checkpoint tensors never loaded, except those `ignore` accepts.
  Status CheckAllUsed(const std::function<bool(const std::string&)>& ignore) const;

 private:
  // The host view of `shard` of `name` (all of it without one): float rows straight from the
  // file, float columns copied into scratch_, FP8 dequantised to f32 into scratch_.
  Result<TensorView> FindShard(const std::string& name, const Shape& expected, const Shard& shard);
  Result<TensorView> Find(const std::string& name, const Shape& expected) { return FindShard(name, expected, {}); }
  // `shard` of the 2-D FP8 weight w [rows, cols] as f32: element (i, j) of the whole tensor
  // times the scale of block (i / block_rows, j / block_cols).
  Result<TensorView> DequantizeFp8(const std::string& name, const TensorView& w, const Shard& shard);
  // Records `name` (and its fp8 scales) as used without reading it: another rank's shard.
  void MarkUsed(const std::string& name);

  const Checkpoint& checkpoint_;
  Backend& backend_;
  std::set<std::string> used_;
  int fp8_block_rows_ = 128;
  int fp8_block_cols_ = 128;
  std::vector<Tensor> scratch_;  // dequantised weights until the current Load* returns
};

}  // namespace corolla
