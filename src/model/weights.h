// WeightLoader: takes tensors by name from a Checkpoint into a Backend's storage, checking each
// shape, and remembers what was taken so the load can end with an error naming every tensor
// the checkpoint holds that the model does not use. Every error names the tensor, what was
// expected and what was found. Block-scaled FP8 weights (`X.weight` F8_E4M3 with
// `X.weight_scale_inv`, one f32 scale per block) are dequantised on the host before upload,
// except projections loaded by LoadLinear* with native FP8 on (kept FP8 with their scales).
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

// A projection's weight [N, K] as the backend runs it: dense (`dense`, the backend's storage
// dtype, FP8 dequantised) or block-scaled FP8 in row parts (Backend::LinearFp8), each part its
// own e4m3 rows and 128 x 128 scales. Fused projections whose parts do not fill whole 128-row
// blocks (the fixture's q_a 160 | kv_a 48) keep one part each, so no scale block mixes them.
struct LinearWeight {
  struct Fp8Part {
    Tensor w;      // [rows, K] e4m3
    Tensor scale;  // [ceil(rows/128), Fp8ScaleStride(K)] f32; the first ceil(K/128) columns used
    int64_t first_row = 0;
  };
  Tensor dense;
  std::vector<Fp8Part> fp8;
  int64_t rows = 0, cols = 0;
  bool is_fp8() const { return !fp8.empty(); }
};
// out [T, N] = x [T, K] @ w^T through Backend::Linear or LinearFp8 (one call per FP8 part,
// into its columns of out).
void RunLinear(Backend& backend, const TensorView& x, const LinearWeight& w, const TensorView& out);

// Whether FP8 projections stay FP8 on `backend`: COROLLA_FP8 (set by the CLI's --fp8) "native"
// or "dequant"; unset: native where the backend has an FP8 linear of its own (CUDA), dequant on
// the CPU (whose float32 forward of the dequantised weights is what the goldens are).
Result<bool> NativeFp8Requested(const Backend& backend);

// A rank's routed experts kept block-scaled FP8 (Backend::MoeExpertsFp8's layouts).
struct ExpertsFp8 {
  Tensor gate_up, gate_up_scale;  // [El, 2I, H] e4m3; [El, 2 ceil(I/128), ceil(H/128)] f32 (gate's blocks, then up's)
  Tensor down, down_scale;        // [El, H, I] e4m3; [El, ceil(H/128), ceil(I/128)] f32
  bool loaded() const { return gate_up.view().rank() == 3; }
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

  // Keep block-scaled FP8 weights FP8 in LoadLinear* (off: they are dequantised, as Load does).
  void set_native_fp8(bool on) { native_fp8_ = on; }
  // FP8 projections kept FP8, and those dequantised although native FP8 was on (with why).
  int num_native_fp8() const { return num_native_fp8_; }
  const std::vector<std::string>& dequantised_fp8() const { return dequantised_fp8_; }

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
  // A projection weight: as Load / LoadConcat, except that with native FP8 on, FP8 tensors stay
  // FP8 when the backend takes their shape (supports_linear_fp8), the block is 128 x 128 and
  // the shard starts on a block boundary (a shard that cuts a block is dequantised: its first
  // block's scale would not cover 128 of its rows or columns). Parts are all FP8 or all dense.
  Result<LinearWeight> LoadLinear(const std::string& name, const Shape& expected, const Shard& shard = {});
  Result<LinearWeight> LoadLinearConcat(const std::vector<std::string>& names, const std::vector<Shape>& expected,
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

  // The same experts kept FP8 when native FP8 is on, the checkpoint stores them per expert as
  // block-scaled e4m3 (`E.gate_proj.weight` + `_scale_inv`, ...) in 128 x 128 blocks, and the
  // backend takes the shape (supports_moe_fp8): fills *out and answers true. Otherwise loads
  // nothing and answers false (the caller loads bf16 through LoadExperts*; why, when the
  // experts are FP8, is added to dequantised_fp8()). Expert ranges as LoadExperts*: whole
  // experts, so no scale block is cut.
  Result<bool> LoadExpertsFp8(const std::string& prefix, int num_experts, int inter, int hidden, int first_expert,
                              int num_local, ExpertsFp8* out);

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
  // Whether `name`'s shard can stay FP8 (see LoadLinear); `why` says why not, when it is FP8.
  bool NativeFp8(const std::string& name, const Shape& expected, const Shard& shard, std::string* why) const;
  // Records `name` (and its fp8 scales) as used without reading it: another rank's shard.
  void MarkUsed(const std::string& name);

  const Checkpoint& checkpoint_;
  Backend& backend_;
  std::set<std::string> used_;
  int fp8_block_rows_ = 128;
  int fp8_block_cols_ = 128;
  std::vector<Tensor> scratch_;  // dequantised weights until the current Load* returns
  bool native_fp8_ = false;
  int num_native_fp8_ = 0;
  std::vector<std::string> dequantised_fp8_;
};

}  // namespace corolla
