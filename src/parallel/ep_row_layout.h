// The DP-EP wire format shared by parallel/expert_parallel.* and the CUDA kernels
// (parallel/cuda/ep_kernels.*), which nvcc compiles as C++17: plain types only.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace corolla {

constexpr int kMaxEpRanks = 64;  // the routing plan keeps one bit per destination rank

// One dispatched token as it travels: [hidden x act | top_k x i32 local ids | top_k x f32
// weights | pad to 16 bytes]. Ids and weights ride with the payload, so one exchange moves all.
struct EpRowLayout {
  int64_t hidden = 0;
  int64_t top_k = 0;
  DType act = DType::kBF16;
  int64_t ids_offset() const { return hidden * DTypeSize(act); }
  int64_t weights_offset() const { return ids_offset() + 4 * top_k; }
  int64_t row_bytes() const { return (weights_offset() + 4 * top_k + 15) / 16 * 16; }
};

}  // namespace corolla
