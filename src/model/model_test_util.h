// Helpers of the model tests that run forwards on the CPU backend.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model.h"

namespace corolla {

// Zeroed f32 K and V caches of one block of `slots` slots for every layer of `model`.
struct TestCaches {
  std::vector<Tensor> tensors;
  std::vector<KvCacheView> views;
};
inline TestCaches MakeTestCaches(const Model& model, int64_t slots) {
  const KvCacheSpec spec = model.kv_cache_spec();
  TestCaches c;
  c.tensors.reserve(2 * spec.num_layers);
  for (int l = 0; l < spec.num_layers; ++l) {
    c.tensors.push_back(Tensor::Zeros(DType::kF32, {1, spec.num_kv_heads, slots, spec.head_dim}));
    c.tensors.push_back(Tensor::Zeros(DType::kF32, {1, spec.num_kv_heads, slots, spec.head_dim}));
    c.views.push_back({c.tensors[c.tensors.size() - 2].view(), c.tensors.back().view()});
  }
  return c;
}

}  // namespace corolla
