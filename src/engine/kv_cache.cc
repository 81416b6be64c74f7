#include "engine/kv_cache.h"

namespace corolla {

KvCache::KvCache(Backend& backend, const KvCacheSpec& spec, int num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  Shape shape{num_blocks, spec.num_kv_heads, block_size, spec.head_dim};
  for (int l = 0; l < spec.num_layers; ++l) {
    Tensor k = backend.Empty(backend.activation_dtype(), shape);
    Tensor v = spec.shared_kv ? k : backend.Empty(backend.activation_dtype(), shape);
    views_.push_back({k.view(), v.view()});
    tensors_.push_back(std::move(k));
    if (!spec.shared_kv) tensors_.push_back(std::move(v));
  }
}

int64_t KvCache::BytesPerBlock(const KvCacheSpec& spec, int block_size, DType dtype) {
  return (spec.shared_kv ? 1LL : 2LL) * spec.num_layers * spec.num_kv_heads * block_size * spec.head_dim * DTypeSize(dtype);
}

}  // namespace corolla
