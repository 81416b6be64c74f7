#include "engine/state_snapshots.h"

namespace corolla {

StateSnapshots::StateSnapshots(Backend& backend, KvCache& kv_cache, int capacity)
    : backend_(backend), kv_cache_(kv_cache) {
  for (int i = 0; i < capacity; ++i) {
    int slot = kv_cache_.AllocateStateSlot();
    if (slot < 0) break;
    slots_.push_back(slot);
    free_.push_back(slot);
  }
}

void StateSnapshots::CopySlot(int from, int to) {
  for (const LinearStateView& layer : kv_cache_.state_views()) {
    backend_.Copy(layer.conv.Index(from), layer.conv.Index(to));
    backend_.Copy(layer.recurrent.Index(from), layer.recurrent.Index(to));
  }
}

void StateSnapshots::Save(uint64_t hash, int slot) {
  if (slots_.empty()) return;
  if (auto it = by_hash_.find(hash); it != by_hash_.end()) {
    lru_.splice(lru_.end(), lru_, it->second.lru_pos);
    return;
  }
  int target;
  if (!free_.empty()) {
    target = free_.back();
    free_.pop_back();
  } else {
    auto victim = by_hash_.find(lru_.front());
    target = victim->second.slot;
    by_hash_.erase(victim);
    lru_.pop_front();
  }
  CopySlot(slot, target);
  lru_.push_back(hash);
  by_hash_[hash] = {target, std::prev(lru_.end())};
}

bool StateSnapshots::Restore(uint64_t hash, int slot) {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return false;
  lru_.splice(lru_.end(), lru_, it->second.lru_pos);
  CopySlot(it->second.slot, slot);
  return true;
}

}  // namespace corolla
