#include "model/model.h"

#include "model/deepseek_v3.h"
#include "model/qwen3.h"
#include "model/safetensors.h"
#include "parallel/communicator.h"

namespace corolla {

Status CheckExpertLayout(const ModelShard& shard, const std::string& model_type, bool has_experts) {
  if (shard.uses_ep_exchange()) {
    // With --tp > 1 each TP rank of a replica dispatches 1/tp of its (replicated) tokens and the
    // TP all-reduce assembles the MoE output (MakeEpExchange).
    if (shard.ep == nullptr || shard.ep->size() != shard.ep_size) return Internal("DP-EP without an EP communicator");
    if (shard.tp_size > 1 && shard.tp == nullptr) return Internal("DP x TP without a TP communicator");
  } else if (has_experts && shard.ep_size != shard.tp_size) {
    return InvalidArgument(model_type + " does not split over --tp " + std::to_string(shard.tp_size) + " / --ep " +
                           std::to_string(shard.ep_size) +
                           ": the experts must be split over the TP ranks (TP-EP: --ep = --tp) or over all "
                           "ranks with --dp (DP-EP: --ep = --dp x --tp)");
  }
  return Status::Ok();
}

Result<std::unique_ptr<Model>> LoadModel(const std::string& dir, Backend& backend, const ModelShard& shard) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(dir));
  Result<std::unique_ptr<Model>> model = Unsupported("model_type " + config.model_type);
  switch (config.family) {
    case ModelFamily::kQwen3:
    case ModelFamily::kQwen3Moe:
    case ModelFamily::kQwen3Hybrid:
      model = LoadQwen3(config, *checkpoint, backend, shard);
      break;
    case ModelFamily::kDeepseekV3:
      model = LoadDeepseekV3(config, *checkpoint, backend, shard);
      break;
  }
  if (!model.ok()) return model.status().WithContext(dir);
  return model;
}

}  // namespace corolla
