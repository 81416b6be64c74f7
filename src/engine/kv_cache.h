// KvCache: the paged K/V tensors of every attention layer, one [num_blocks, Hk, block_size, D]
// pair per layer in the backend's activation dtype, and for hybrid models the per-sequence
// states of the linear-attention layers in `num_state_slots` slots (conv f32; recurrent f32 or
// bf16 as StateSpec::recurrent_dtype says). Block indices come
// from a BlockPool; state slots from this class's own free list. Not thread-safe.
#pragma once

#include <vector>

#include "kernels/backend.h"
#include "model/model.h"

namespace corolla {

class KvCache {
 public:
  KvCache(Backend& backend, const KvCacheSpec& spec, int num_blocks, int block_size,
          const StateSpec& state_spec = {}, int num_state_slots = 0);

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  const std::vector<KvCacheView>& views() const { return views_; }
  const std::vector<LinearStateView>& state_views() const { return state_views_; }
  bool has_state() const { return !state_views_.empty(); }
  // A free state slot, or -1 when all are taken. Its contents are stale: a sequence's first
  // chunk (at position 0) starts from zeros.
  int AllocateStateSlot();
  void FreeStateSlot(int slot);

  // Bytes of one block across all layers (K and V).
  static int64_t BytesPerBlock(const KvCacheSpec& spec, int block_size, DType dtype);

 private:
  int num_blocks_;
  int block_size_;
  std::vector<Tensor> tensors_;
  std::vector<KvCacheView> views_;
  std::vector<Tensor> state_tensors_;
  std::vector<LinearStateView> state_views_;
  std::vector<int> free_state_slots_;
};

}  // namespace corolla
