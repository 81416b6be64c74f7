#include "cli/expert_load.h"

#include <algorithm>
#include <cstdio>

#include "base/check.h"
#include "kernels/backend.h"

namespace corolla {

void ExpertLoad::Record(Backend& backend, const TensorView& topk_ids, int experts) {
  COROLLA_CHECK(topk_ids.dtype == DType::kI32 && topk_ids.is_contiguous() && experts > 0)
      << "expert load: ids " << topk_ids.ToString() << ", " << experts << " experts";
  std::vector<int32_t> ids(static_cast<size_t>(topk_ids.numel()));
  backend.Synchronize();
  backend.CopyToHost(topk_ids, ids.data());
  std::vector<int64_t> rows(static_cast<size_t>(experts), 0);
  for (int32_t id : ids)
    if (id >= 0 && id < experts) ++rows[static_cast<size_t>(id)];
  layers_.push_back(std::move(rows));
}

std::string ExpertLoad::Summary(int tile_rows, int block_rows) const {
  if (layers_.empty()) return "  expert load: no MoE layer ran\n";
  double active = 0, routed = 0, tiles = 0, full = 0, tails = 0, half_tails = 0, computed = 0, max_sum = 0;
  int64_t max_rows = 0;
  int experts = 0;
  for (const std::vector<int64_t>& rows : layers_) {
    experts = static_cast<int>(rows.size());
    int64_t layer_max = 0;
    for (int64_t r : rows) {
      if (r == 0) continue;
      active += 1;
      routed += r;
      tiles += (r + tile_rows - 1) / tile_rows;
      full += r / tile_rows;
      const int64_t tail = r % tile_rows;
      tails += tail != 0;
      half_tails += tail != 0 && tail <= block_rows;
      computed += static_cast<double>((r + block_rows - 1) / block_rows) * block_rows;
      layer_max = std::max(layer_max, r);
    }
    max_sum += static_cast<double>(layer_max);
    max_rows = std::max(max_rows, layer_max);
  }
  const double n = static_cast<double>(layers_.size());
  char buf[640];
  std::snprintf(buf, sizeof(buf),
                "  expert load over %d MoE layers (means a layer): %.1f of %d experts active, %.1f rows an "
                "active expert, the busiest %.1f (%ld at most)\n"
                "    %d-row m-tiles: %.1f a layer, %.1f full and %.1f tails (%.1f of at most %d rows); rows "
                "routed / rows the %d-row blocks compute: %.1f%%\n",
                static_cast<int>(layers_.size()), active / n, experts, active > 0 ? routed / active : 0.0,
                max_sum / n, static_cast<long>(max_rows), tile_rows, tiles / n, full / n, tails / n,
                half_tails / n, block_rows, block_rows, computed > 0 ? 100.0 * routed / computed : 0.0);
  return buf;
}

}  // namespace corolla
