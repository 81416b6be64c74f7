// StateSnapshots: copies of hybrid models' linear-attention states taken at block boundaries,
// keyed by the prefix-cache hash of the block that ends there, so a prefix-cache hit restores
// the recurrent and conv states along with the paged K/V of the attention layers. A fixed
// number of snapshot slots (taken from the KvCache's state slots) with LRU eviction; a hit
// refreshes recency. Not thread-safe: owned by the engine's step thread.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "engine/kv_cache.h"

namespace corolla {

class StateSnapshots {
 public:
  // Takes `capacity` state slots of `kv_cache` for snapshots (fewer if it has fewer free).
  StateSnapshots(Backend& backend, KvCache& kv_cache, int capacity);

  int capacity() const { return static_cast<int>(slots_.size()); }
  int size() const { return static_cast<int>(by_hash_.size()); }
  bool Has(uint64_t hash) const { return by_hash_.count(hash) != 0; }
  // Copies the states of `slot` under `hash` (evicting the least recently used snapshot when
  // full). A hash already saved is only refreshed.
  void Save(uint64_t hash, int slot);
  // Copies the snapshot of `hash` into `slot`; false when there is none.
  bool Restore(uint64_t hash, int slot);

 private:
  void CopySlot(int from, int to);

  Backend& backend_;
  KvCache& kv_cache_;
  std::vector<int> slots_;  // the snapshot slots
  std::vector<int> free_;   // unused snapshot slots
  std::list<uint64_t> lru_;  // least recently used first
  struct Entry {
    int slot;
    std::list<uint64_t>::iterator lru_pos;
  };
  std::unordered_map<uint64_t, Entry> by_hash_;
};

}  // namespace corolla
