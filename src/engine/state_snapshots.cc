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

int StateSnapshots::TakeSlot() {
  if (!free_.empty()) {
    int target = free_.back();
    free_.pop_back();
    return target;
  }
  if (lru_.empty()) return -1;
  auto victim = by_hash_.find(lru_.front());
  int target = victim->second.slot;
  by_hash_.erase(victim);
  lru_.pop_front();
  return target;
}

void StateSnapshots::Save(uint64_t hash, int slot) {
  if (auto it = by_hash_.find(hash); it != by_hash_.end()) {
    lru_.splice(lru_.end(), lru_, it->second.lru_pos);
    return;
  }
  int target = TakeSlot();
  if (target < 0) return;
  CopySlot(slot, target);
  lru_.push_back(hash);
  by_hash_[hash] = {target, std::prev(lru_.end())};
}

int StateSnapshots::Capture(int slot) {
  int target = TakeSlot();
  if (target >= 0) CopySlot(slot, target);
  return target;
}

void StateSnapshots::Publish(int captured, uint64_t hash) {
  if (auto it = by_hash_.find(hash); it != by_hash_.end()) {
    lru_.splice(lru_.end(), lru_, it->second.lru_pos);
    free_.push_back(captured);
    return;
  }
  lru_.push_back(hash);
  by_hash_[hash] = {captured, std::prev(lru_.end())};
}

void StateSnapshots::Discard(int captured) { free_.push_back(captured); }

bool StateSnapshots::Restore(uint64_t hash, int slot) {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return false;
  lru_.splice(lru_.end(), lru_, it->second.lru_pos);
  CopySlot(it->second.slot, slot);
  return true;
}

}  // namespace corolla
