// KvCache: the paged K/V tensors of every attention layer, one [num_blocks, Hk, block_size, D]
// pair per layer in the backend's activation dtype. Block indices come from a BlockPool; the
// cache itself only owns memory. Not thread-safe.
#pragma once

#include <vector>

#include "kernels/backend.h"
#include "model/model.h"

namespace corolla {

class KvCache {
 public:
  KvCache(Backend& backend, const KvCacheSpec& spec, int num_blocks, int block_size);

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  const std::vector<KvCacheView>& views() const { return views_; }

  // Bytes of one block across all layers (K and V).
  static int64_t BytesPerBlock(const KvCacheSpec& spec, int block_size, DType dtype);

 private:
  int num_blocks_;
  int block_size_;
  std::vector<Tensor> tensors_;
  std::vector<KvCacheView> views_;
};

}  // namespace corolla
