#include "engine/block_pool.h"

#include <algorithm>

#include "base/check.h"

namespace corolla {

uint64_t BlockHash(uint64_t parent_hash, std::span<const int32_t> tokens) {
  // splitmix64-style mixing of each token into the running state; 0 is reserved for "no parent".
  uint64_t h = parent_hash ^ 0x9e3779b97f4a7c15ull;
  for (int32_t t : tokens) {
    h ^= static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
  }
  return h == 0 ? 1 : h;
}

BlockPool::BlockPool(int num_blocks, bool enable_prefix_caching)
    : enable_prefix_caching_(enable_prefix_caching), ref_counts_(num_blocks, 0), blocks_(num_blocks) {
  uncached_free_.reserve(num_blocks);
  for (int b = num_blocks - 1; b >= 0; --b) uncached_free_.push_back(b);
}

void BlockPool::Evict(int32_t block) {
  CachedBlock& c = blocks_[block];
  COROLLA_CHECK(c.registered && ref_counts_[block] == 0) << "evict of block " << block;
  lru_.erase(c.lru_pos);
  by_hash_.erase(c.hash);
  c = CachedBlock{};
}

std::vector<int32_t> BlockPool::Allocate(int n) {
  COROLLA_CHECK(CanAllocate(n)) << "allocate " << n << " blocks with " << num_free() << " free";
  std::vector<int32_t> blocks;
  blocks.reserve(n);
  while (static_cast<int>(blocks.size()) < n && !uncached_free_.empty()) {
    blocks.push_back(uncached_free_.back());
    uncached_free_.pop_back();
  }
  while (static_cast<int>(blocks.size()) < n) {
    int32_t b = lru_.front();
    Evict(b);
    blocks.push_back(b);
  }
  for (int32_t b : blocks) ref_counts_[b] = 1;
  return blocks;
}

void BlockPool::Free(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    COROLLA_CHECK(b >= 0 && b < num_blocks() && ref_counts_[b] > 0) << "free of block " << b;
    if (--ref_counts_[b] > 0) continue;
    CachedBlock& c = blocks_[b];
    if (c.registered) {
      c.lru_pos = lru_.insert(lru_.end(), b);
    } else {
      uncached_free_.push_back(b);
    }
  }
}

std::optional<int32_t> BlockPool::FindCached(uint64_t hash, uint64_t parent_hash,
                                             std::span<const int32_t> tokens) const {
  if (!enable_prefix_caching_) return std::nullopt;
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const CachedBlock& c = blocks_[it->second];
  if (c.parent_hash != parent_hash || !std::equal(c.tokens.begin(), c.tokens.end(), tokens.begin(), tokens.end()))
    return std::nullopt;
  return it->second;
}

void BlockPool::Share(int32_t block) {
  COROLLA_CHECK(block >= 0 && block < num_blocks()) << "share of block " << block;
  CachedBlock& c = blocks_[block];
  if (ref_counts_[block] == 0) {
    COROLLA_CHECK(c.registered) << "share of free uncached block " << block;
    lru_.erase(c.lru_pos);
  }
  ++ref_counts_[block];
}

bool BlockPool::Register(int32_t block, uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens) {
  if (!enable_prefix_caching_) return false;
  CachedBlock& c = blocks_[block];
  COROLLA_CHECK(ref_counts_[block] > 0) << "register of free block " << block;
  if (c.registered || by_hash_.count(hash)) return false;
  c.hash = hash;
  c.parent_hash = parent_hash;
  c.tokens.assign(tokens.begin(), tokens.end());
  c.registered = true;
  by_hash_[hash] = block;
  return true;
}

void BlockPool::ResetPrefixCache() {
  while (!lru_.empty()) {
    int32_t b = lru_.front();
    Evict(b);
    uncached_free_.push_back(b);
  }
}

}  // namespace corolla
