#include "engine/kv_cache.h"

namespace corolla {

KvCache::KvCache(Backend& backend, const KvCacheSpec& spec, int num_blocks, int block_size,
                 const StateSpec& state_spec, int num_state_slots)
    : num_blocks_(num_blocks), block_size_(block_size) {
  Shape shape{num_blocks, spec.num_kv_heads, block_size, spec.head_dim};
  for (int l = 0; l < spec.num_layers; ++l) {
    Tensor k = backend.Empty(backend.activation_dtype(), shape);
    Tensor v = spec.shared_kv ? k : backend.Empty(backend.activation_dtype(), shape);
    views_.push_back({k.view(), v.view()});
    tensors_.push_back(std::move(k));
    if (!spec.shared_kv) tensors_.push_back(std::move(v));
  }
  if (state_spec.num_layers > 0) {
    COROLLA_CHECK(num_state_slots > 0) << "a hybrid model needs state slots";
    const StateSpec& st = state_spec;
    COROLLA_CHECK(st.recurrent_dtype == DType::kF32 || st.recurrent_dtype == DType::kBF16)
        << "linear-attention state dtype " << DTypeName(st.recurrent_dtype);
    for (int l = 0; l < st.num_layers; ++l) {
      Tensor conv = backend.Empty(DType::kF32, {num_state_slots, st.conv_channels, st.conv_history});
      Tensor rec = backend.Empty(st.recurrent_dtype, {num_state_slots, st.num_heads, st.key_dim, st.value_dim});
      state_views_.push_back({conv.view(), rec.view()});
      state_tensors_.push_back(std::move(conv));
      state_tensors_.push_back(std::move(rec));
    }
    for (int slot = num_state_slots - 1; slot >= 0; --slot) free_state_slots_.push_back(slot);
  }
}

int KvCache::AllocateStateSlot() {
  if (free_state_slots_.empty()) return -1;
  int slot = free_state_slots_.back();
  free_state_slots_.pop_back();
  return slot;
}

void KvCache::FreeStateSlot(int slot) {
  if (slot >= 0) free_state_slots_.push_back(slot);
}

int64_t KvCache::BytesPerBlock(const KvCacheSpec& spec, int block_size, DType dtype) {
  return (spec.shared_kv ? 1LL : 2LL) * spec.num_layers * spec.num_kv_heads * block_size * spec.head_dim * DTypeSize(dtype);
}

}  // namespace corolla
