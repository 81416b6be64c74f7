#include "model/model.h"

#include "model/deepseek_v3.h"
#include "model/qwen3.h"
#include "model/safetensors.h"

namespace corolla {

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
