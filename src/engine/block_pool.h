// BlockPool: the free list, reference counts and prefix cache of the paged KV cache's
// fixed-size blocks. It hands out block indices; the KV tensors themselves live in KvCache.
// Pairs a question with an action (CanAllocate / Allocate, FindCached / Share) so the scheduler
// reads as prose.
//
// Prefix cache: a full block whose K/V is computed can be registered under the hash of its
// tokens chained to its parent block's hash (BlockHash). A registered block whose last
// reference is dropped stays cached on an LRU list and still counts as free; Allocate takes
// never-cached blocks first and then evicts the least recently freed cached block. A hit
// (FindCached + Share) takes a reference, reviving the block from the LRU list if it was free.
// Not thread-safe: owned by the engine's step thread.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace corolla {

// Hash of one full block of tokens chained to its parent's hash (0 for the first block).
uint64_t BlockHash(uint64_t parent_hash, std::span<const int32_t> tokens);

class BlockPool {
 public:
  explicit BlockPool(int num_blocks, bool enable_prefix_caching = true);

  int num_blocks() const { return static_cast<int>(ref_counts_.size()); }
  // Blocks nobody references: never-cached ones plus cached ones that may be evicted.
  int num_free() const { return static_cast<int>(uncached_free_.size() + lru_.size()); }
  int num_used() const { return num_blocks() - num_free(); }
  int num_cached_free() const { return static_cast<int>(lru_.size()); }
  bool CanAllocate(int n) const { return n <= num_free(); }
  // Takes n free blocks (reference count 1 each), evicting cached ones last and LRU first.
  // Requires CanAllocate(n).
  std::vector<int32_t> Allocate(int n);
  // Drops one reference of each block; blocks at zero become free (cached ones go to the LRU
  // list in the given order, so the first is evicted first).
  void Free(std::span<const int32_t> blocks);
  int ref_count(int32_t block) const { return ref_counts_[block]; }

  // --- prefix cache ---
  bool prefix_caching() const { return enable_prefix_caching_; }
  // The cached block holding `tokens` after the chain `parent_hash`, under `hash`. Does not
  // take a reference.
  std::optional<int32_t> FindCached(uint64_t hash, uint64_t parent_hash,
                                    std::span<const int32_t> tokens) const;
  // Takes one more reference on a block (a prefix-cache hit); revives it if it was free.
  void Share(int32_t block);
  // Registers a full, computed block under `hash` unless that hash is already cached (then
  // the block stays unregistered). Returns whether it was registered.
  bool Register(int32_t block, uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens);
  // Drops every cached block that nobody references (they become plain free blocks).
  void ResetPrefixCache();

 private:
  struct CachedBlock {
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    std::vector<int32_t> tokens;  // verified on lookup, so a hash collision is never a hit
    bool registered = false;
    std::list<int32_t>::iterator lru_pos;  // valid while free and registered
  };
  void Evict(int32_t block);

  bool enable_prefix_caching_;
  std::vector<int32_t> uncached_free_;  // LIFO: recently freed blocks are reused first
  std::list<int32_t> lru_;              // free cached blocks, least recently freed first
  std::vector<int32_t> ref_counts_;
  std::vector<CachedBlock> blocks_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
};

}  // namespace corolla
