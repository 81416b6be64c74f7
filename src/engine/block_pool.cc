#include "engine/block_pool.h"

#include "base/check.h"

namespace corolla {

BlockPool::BlockPool(int num_blocks) : ref_counts_(num_blocks, 0) {
  free_.reserve(num_blocks);
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

std::vector<int32_t> BlockPool::Allocate(int n) {
  COROLLA_CHECK(CanAllocate(n)) << "allocate " << n << " blocks with " << num_free() << " free";
  std::vector<int32_t> blocks(free_.end() - n, free_.end());
  free_.resize(free_.size() - n);
  for (int32_t b : blocks) ref_counts_[b] = 1;
  return blocks;
}

void BlockPool::Free(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    COROLLA_CHECK(b >= 0 && b < num_blocks() && ref_counts_[b] > 0) << "free of block " << b;
    if (--ref_counts_[b] == 0) free_.push_back(b);
  }
}

}  // namespace corolla
