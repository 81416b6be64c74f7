// ExpertLoad: the rows each routed expert gets in the MoE layers of one forward, and what the
// grouped GEMMs' tiles make of them (`bench prefill --expert-load`): how many m-tiles a layer
// runs, how many are tails, and the share of the tensor cores' rows that carry routed rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace corolla {

class Backend;

class ExpertLoad {
 public:
  // One MoE layer's routing: topk_ids [T, k] (i32, on `backend`'s device) over `experts`
  // experts; ids outside [0, experts) (an expert another rank holds) are not counted.
  void Record(Backend& backend, const TensorView& topk_ids, int experts);
  // Rows of every expert (E entries) of each recorded layer, in order.
  const std::vector<std::vector<int64_t>>& layers() const { return layers_; }
  // Lines (each ending in '\n') that summarise the recorded layers for m-tiles of `tile_rows`
  // rows computed in `block_rows`-row blocks (the wgmma kernels' 128-row tiles skip an idle
  // 64-row half).
  std::string Summary(int tile_rows = 128, int block_rows = 64) const;

 private:
  std::vector<std::vector<int64_t>> layers_;
};

}  // namespace corolla
