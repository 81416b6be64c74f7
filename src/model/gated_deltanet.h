// The Gated DeltaNet token mixer of the Qwen3.5 hybrids: projections, causal conv1d with its
// rolling state, the gated delta rule over the per-sequence recurrent state, the gated RMSNorm
// and the output projection. A layer's weights and its forward; the states live in the
// engine's KvCache (LinearStateView) and are indexed by ForwardBatch::state_slots.
#pragma once

#include <string>

#include "model/config.h"
#include "model/model.h"
#include "model/weights.h"

namespace corolla {

struct GatedDeltaNetWeights {
  Tensor in_proj;    // [2 Kd + Vd + Vd + 2 Hv, H]: q | k | v | z | b | a rows
  Tensor conv;       // [C, K] (C = 2 Kd + Vd)
  Tensor a_log;      // [Hv] f32
  Tensor dt_bias;    // [Hv] f32
  Tensor norm;       // [Dv]
  Tensor out_proj;   // [H, Vd]
};

// Loads the layer under `prefix` ("model.layers.N.linear_attn.").
Status LoadGatedDeltaNet(WeightLoader& w, Backend& backend, const ModelConfig& config,
                         const std::string& prefix, GatedDeltaNetWeights* out);

// x [T, H] -> out [T, H], reading and updating `state` for the batch's sequences.
void GatedDeltaNetForward(Backend& backend, const ModelConfig& config, const GatedDeltaNetWeights& w,
                          const TensorView& x, const ForwardBatch& batch, const LinearStateView& state,
                          const TensorView& out);

}  // namespace corolla
