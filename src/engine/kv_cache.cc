#include "engine/kv_cache.h"

namespace corolla {

KvCache::KvCache(Backend& backend, const KvCacheSpec& spec, int num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  Shape shape{num_blocks, spec.num_kv_heads, block_size, spec.head_dim};
  for (int l = 0; l < spec.num_layers; ++l) {
    tensors_.push_back(backend.Empty(backend.activation_dtype(), shape));
    tensors_.push_back(backend.Empty(backend.activation_dtype(), shape));
    views_.push_back({tensors_[2 * l].view(), tensors_[2 * l + 1].view()});
  }
}

int64_t KvCache::BytesPerBlock(const KvCacheSpec& spec, int block_size, DType dtype) {
  return 2LL * spec.num_layers * spec.num_kv_heads * block_size * spec.head_dim * DTypeSize(dtype);
}

}  // namespace corolla
