// BlockPool: the free list and reference counts of the paged KV cache's fixed-size blocks.
// It hands out block indices; the KV tensors themselves live in KvCache. Pairs a question with
// an action (CanAllocate / Allocate) so the scheduler reads as prose. Not thread-safe: owned by
// the engine's step thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace corolla {

class BlockPool {
 public:
  explicit BlockPool(int num_blocks);

  int num_blocks() const { return static_cast<int>(ref_counts_.size()); }
  int num_free() const { return static_cast<int>(free_.size()); }
  bool CanAllocate(int n) const { return n <= num_free(); }
  // Takes n free blocks (reference count 1 each). Requires CanAllocate(n).
  std::vector<int32_t> Allocate(int n);
  // Drops one reference of each block; blocks at zero return to the free list.
  void Free(std::span<const int32_t> blocks);
  int ref_count(int32_t block) const { return ref_counts_[block]; }

 private:
  std::vector<int32_t> free_;  // LIFO: recently freed blocks are reused first
  std::vector<int32_t> ref_counts_;
};

}  // namespace corolla
