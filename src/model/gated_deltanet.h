// The Gated DeltaNet token mixer of the Qwen3.5 hybrids: projections, causal conv1d with its
// rolling state, the gated delta rule over the per-sequence recurrent state, the gated RMSNorm
// and the output projection. A layer's weights and its forward; the states live in the
// engine's KvCache (LinearStateView) and are indexed by ForwardBatch::state_slots.
// Under tensor parallelism a rank holds a slice of the heads (LinearHeads): the in_proj rows,
// conv channels, A_log / dt_bias and out_proj columns of those heads only, and its states hold
// only their channels and heads; the caller sums the ranks' outputs (out_proj is row-parallel).
#pragma once

#include <string>

#include "model/config.h"
#include "model/model.h"
#include "model/weights.h"

namespace corolla {

// The heads of a Gated DeltaNet layer one rank holds: value heads [first_value_head, +
// num_value_heads) and the key heads they read, [first_key_head, + num_key_heads). Value head h
// reads key head h / (Hv / Hk), so a rank keeps whole key-head groups; with more ranks than key
// heads, each key head (its q/k rows and conv channels) is replicated on the tp / Hk ranks that
// split its group of value heads.
struct LinearHeads {
  int first_key_head = 0, num_key_heads = 0;
  int first_value_head = 0, num_value_heads = 0;
  int key_dim(const LinearAttentionConfig& la) const { return num_key_heads * la.key_head_dim; }
  int value_dim(const LinearAttentionConfig& la) const {
    return num_value_heads * la.value_head_dim;
  }
  int conv_channels(const LinearAttentionConfig& la) const {  // q | k | v
    return 2 * key_dim(la) + value_dim(la);
  }
};

// Rank `tp_rank`'s heads of `tp_size`; an error naming the dimension that does not split.
Result<LinearHeads> PlanLinearHeads(const LinearAttentionConfig& la, int tp_size, int tp_rank);

struct GatedDeltaNetWeights {
  LinearHeads heads;  // this rank's; below, Hk, Hv, Kd = Hk Dk, Vd = Hv Dv count only those
  Tensor in_proj;     // [2 Kd + Vd + Vd + 2 Hv, H]: q | k | v | z | b | a rows
  Tensor conv;        // [C, K] (C = 2 Kd + Vd)
  Tensor a_log;       // [Hv] f32
  Tensor dt_bias;     // [Hv] f32
  Tensor norm;        // [Dv] (shared by all heads)
  Tensor out_proj;    // [H, Vd]: the columns of this rank's value heads
};

// Loads `heads` of the layer under `prefix` ("model.layers.N.linear_attn.").
Status LoadGatedDeltaNet(WeightLoader& w, Backend& backend, const ModelConfig& config,
                         const LinearHeads& heads, const std::string& prefix,
                         GatedDeltaNetWeights* out);

// x [T, H] -> out [T, H], reading and updating `state` for the batch's sequences. Under tensor
// parallelism out is this rank's partial sum (the caller all-reduces it).
void GatedDeltaNetForward(Backend& backend, const ModelConfig& config,
                          const GatedDeltaNetWeights& w, const TensorView& x,
                          const ForwardBatch& batch, const LinearStateView& state,
                          const TensorView& out);

}  // namespace corolla
