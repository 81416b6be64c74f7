#include "model/weights.h"

namespace corolla {
namespace {

bool IsFloat(DType t) { return t == DType::kBF16 || t == DType::kF16 || t == DType::kF32; }

}  // namespace

Result<TensorView> WeightLoader::Find(const std::string& name, const Shape& expected) {
  const SafetensorsEntry* entry = checkpoint_.Find(name);
  if (entry == nullptr)
    return NotFound("tensor " + name + ": missing from the checkpoint (expected " +
                    expected.ToString() + ")");
  ASSIGN_OR_RETURN(TensorView view, checkpoint_.Get(name));
  if (view.shape != expected || !IsFloat(view.dtype))
    return InvalidArgument("tensor " + name + ": expected " + expected.ToString() +
                           " bf16/f16/f32, got " + view.ToString());
  used_.insert(name);
  return view;
}

Result<Tensor> WeightLoader::Load(const std::string& name, const Shape& expected) {
  ASSIGN_OR_RETURN(TensorView view, Find(name, expected));
  return backend_.LoadWeight(view);
}

Result<Tensor> WeightLoader::LoadConcat(const std::vector<std::string>& names,
                                        const std::vector<Shape>& expected) {
  std::vector<TensorView> views;
  for (size_t i = 0; i < names.size(); ++i) {
    ASSIGN_OR_RETURN(TensorView view, Find(names[i], expected[i]));
    views.push_back(view);
  }
  return backend_.LoadWeightConcat(views);
}

Result<Tensor> WeightLoader::LoadExpertsGateUp(const std::string& prefix, int num_experts,
                                               int inter, int hidden) {
  if (checkpoint_.Has(prefix + "gate_up_proj")) {
    ASSIGN_OR_RETURN(TensorView view, Find(prefix + "gate_up_proj", {num_experts, 2 * inter, hidden}));
    return backend_.LoadWeight(view);
  }
  // Per-expert: gate then up rows of each expert, experts in order -> [E * 2I, H] -> [E, 2I, H].
  std::vector<TensorView> views;
  for (int e = 0; e < num_experts; ++e) {
    std::string p = prefix + std::to_string(e) + ".";
    ASSIGN_OR_RETURN(TensorView gate, Find(p + "gate_proj.weight", {inter, hidden}));
    ASSIGN_OR_RETURN(TensorView up, Find(p + "up_proj.weight", {inter, hidden}));
    views.push_back(gate);
    views.push_back(up);
  }
  return backend_.LoadWeightConcat(views).Reshaped({num_experts, 2 * inter, hidden});
}

Result<Tensor> WeightLoader::LoadExpertsDown(const std::string& prefix, int num_experts, int inter,
                                             int hidden) {
  if (checkpoint_.Has(prefix + "down_proj")) {
    ASSIGN_OR_RETURN(TensorView view, Find(prefix + "down_proj", {num_experts, hidden, inter}));
    return backend_.LoadWeight(view);
  }
  std::vector<TensorView> views;
  for (int e = 0; e < num_experts; ++e) {
    ASSIGN_OR_RETURN(TensorView down,
                     Find(prefix + std::to_string(e) + ".down_proj.weight", {hidden, inter}));
    views.push_back(down);
  }
  return backend_.LoadWeightConcat(views).Reshaped({num_experts, hidden, inter});
}

Status WeightLoader::CheckAllUsed(const std::function<bool(const std::string&)>& ignore) const {
  std::vector<std::string> unused;
  for (const std::string& name : checkpoint_.Names())
    if (!used_.count(name) && !ignore(name)) unused.push_back(name);
  if (unused.empty()) return Status::Ok();
  std::string msg = std::to_string(unused.size()) + " unexpected tensor(s) in the checkpoint: ";
  for (size_t i = 0; i < unused.size() && i < 8; ++i) msg += (i ? ", " : "") + unused[i];
  if (unused.size() > 8) msg += ", ...";
  return InvalidArgument(msg);
}

}  // namespace corolla
