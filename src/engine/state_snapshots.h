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

  // Save in two halves, for async scheduling, where a step's states must be copied before the
  // next step changes them but the block's last token (so its hash) reaches the host later.
  // Capture copies the states of `slot` into a snapshot slot that no lookup sees yet (evicting
  // the least recently used snapshot when none is free) and returns it, or -1 when every
  // snapshot slot is held by captures. Publish files it under `hash` (dropping it if the hash
  // is saved already); Discard frees it.
  int Capture(int slot);
  void Publish(int captured, uint64_t hash);
  void Discard(int captured);

 private:
  void CopySlot(int from, int to);
  int TakeSlot();  // a free snapshot slot, else the least recently used one; -1 if none

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
