#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <functional>

#include "tokenizer/utf8.h"

namespace corolla {
namespace {

// Working memory of one MergeWord call, reused per thread.
struct Symbol {
  int32_t id;
  int32_t prev, next;  // indices into the symbol list, -1 at the ends
  bool alive;
};
struct Candidate {
  int32_t rank, pos, new_id;
  // std::push_heap builds a max-heap: the greatest is the lowest rank, then the leftmost.
  bool operator<(const Candidate& o) const {
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};
struct MergeScratch {
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::string mapped;
};
// A 64-bit hash of a word (wyhash-style multiply-mix over 8-byte loads).
inline uint64_t Mix(uint64_t a, uint64_t b) {
  __uint128_t r = static_cast<__uint128_t>(a) * b;
  return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
}
uint64_t WordHash(std::string_view s) {
  uint64_t h = 0x243F6A8885A308D3ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = Mix(h ^ w, 0x9E3779B97F4A7C15ull);
  }
  if (i < s.size()) {
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = Mix(h ^ w, 0xC2B2AE3D27D4EB4Full);
  }
  return Mix(h, 0x165667B19E3779F9ull);
}

MergeScratch& ThreadScratch() {
  thread_local MergeScratch scratch;
  return scratch;
}

}  // namespace

size_t StringHash::operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }

Result<std::unique_ptr<BpeModel>> BpeModel::FromJson(const nlohmann::json& config) {
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string())
    return Corrupt("model: expected an object with a string \"type\"");
  const std::string& type = config["type"].get_ref<const std::string&>();
  if (type != "BPE") return Unsupported("model type \"" + type + "\" is not supported (only BPE)");
  auto m = std::make_unique<BpeModel>();
  if (config.contains("dropout") && config["dropout"].is_number() &&
      config["dropout"].get<double>() > 0.0)
    return Unsupported("BPE dropout is not supported");
  auto get_string = [&](const char* key) -> std::string {
    auto it = config.find(key);
    return it != config.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  auto get_bool = [&](const char* key) {
    auto it = config.find(key);
    return it != config.end() && it->is_boolean() && it->get<bool>();
  };
  m->continuing_subword_prefix_ = get_string("continuing_subword_prefix");
  m->end_of_word_suffix_ = get_string("end_of_word_suffix");
  m->fuse_unk_ = get_bool("fuse_unk");
  m->byte_fallback_ = get_bool("byte_fallback");
  m->ignore_merges_ = get_bool("ignore_merges");

  auto vocab = config.find("vocab");
  if (vocab == config.end() || !vocab->is_object())
    return Corrupt("model: expected a \"vocab\" object");
  m->vocab_.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX)
      return Corrupt("model vocab: token \"" + it.key() + "\" has no valid id");
    m->vocab_.emplace(it.key(), static_cast<int32_t>(it.value().get<int64_t>()));
  }
  std::string unk = get_string("unk_token");
  if (!unk.empty()) {
    auto it = m->vocab_.find(unk);
    if (it == m->vocab_.end()) return Corrupt("model: unk_token \"" + unk + "\" is not in vocab");
    m->unk_id_ = it->second;
  }

  auto merges = config.find("merges");
  if (merges == config.end() || !merges->is_array())
    return Corrupt("model: expected a \"merges\" list");
  size_t capacity = 16;
  while (capacity < 2 * merges->size() + 2) capacity *= 2;
  m->merge_table_.assign(capacity, MergeEntry{});
  m->merge_mask_ = capacity - 1;
  size_t prefix_len = m->continuing_subword_prefix_.size();
  std::string a, b, merged;
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const auto& entry = (*merges)[rank];
    if (entry.is_string()) {
      const std::string& line = entry.get_ref<const std::string&>();
      size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
        return Corrupt("model merges[" + std::to_string(rank) + "]: \"" + line +
                       "\" is not two tokens separated by one space");
      a.assign(line, 0, space);
      b.assign(line, space + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
               entry[1].is_string()) {
      a = entry[0].get<std::string>();
      b = entry[1].get<std::string>();
    } else {
      return Corrupt("model merges[" + std::to_string(rank) + "]: expected \"a b\" or [a, b]");
    }
    auto ia = m->vocab_.find(a), ib = m->vocab_.find(b);
    if (ia == m->vocab_.end() || ib == m->vocab_.end())
      return Corrupt("model merges[" + std::to_string(rank) + "]: token \"" +
                     (ia == m->vocab_.end() ? a : b) + "\" is not in vocab");
    merged = a;
    merged.append(b, std::min(prefix_len, b.size()));
    auto im = m->vocab_.find(merged);
    if (im == m->vocab_.end())
      return Corrupt("model merges[" + std::to_string(rank) + "]: merged token \"" + merged +
                     "\" is not in vocab");
    // A repeated pair keeps its last rank, as HF's map building does.
    m->InsertMerge(PairKey(ia->second, ib->second), Merge{static_cast<int32_t>(rank), im->second});
  }

  const auto& alphabet = utf8::GetByteLevelAlphabet();
  for (int byte = 0; byte < 256; ++byte) {
    auto it = m->vocab_.find(alphabet.byte_to_utf8[byte]);
    m->byte_ids_[byte] = it == m->vocab_.end() ? -1 : it->second;
  }
  for (auto& cache : m->cache_) cache.reset(new Shard[kNumShards]);
  m->short_cache_.reset(new ShortSlot[kNumShortSlots]);
  return m;
}

void BpeModel::InsertMerge(uint64_t key, Merge merge) {
  for (size_t i = MergeSlot(key);; i = (i + 1) & merge_mask_) {
    MergeEntry& e = merge_table_[i];
    if (e.key == key || e.key == kEmptyKey) {
      e.key = key;
      e.merge = merge;
      return;
    }
  }
}

bool BpeModel::LookupShort(std::string_view word, uint64_t hash, bool raw_bytes,
                           std::vector<int32_t>* ids) const {
  const ShortSlot& slot = short_cache_[hash & (kNumShortSlots - 1)];
  uint32_t v1 = slot.version.load(std::memory_order_acquire);
  if (v1 & 1) return false;
  uint64_t w[7];
  for (int i = 0; i < 7; ++i) w[i] = slot.words[i].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (slot.version.load(std::memory_order_relaxed) != v1) return false;
  uint32_t tag = static_cast<uint32_t>(hash >> 32) | 1;
  size_t len = (w[0] >> 32) & 0xFF, num_ids = (w[0] >> 40) & 0xFF;
  if (static_cast<uint32_t>(w[0]) != tag || len != word.size() || ((w[0] >> 48) & 1) != raw_bytes)
    return false;
  if (std::memcmp(reinterpret_cast<const char*>(&w[1]), word.data(), len) != 0) return false;
  const auto* slot_ids = reinterpret_cast<const int32_t*>(&w[4]);
  ids->insert(ids->end(), slot_ids, slot_ids + num_ids);
  return true;
}

void BpeModel::StoreShort(std::string_view word, uint64_t hash, bool raw_bytes,
                          const std::vector<int32_t>& ids) const {
  ShortSlot& slot = short_cache_[hash & (kNumShortSlots - 1)];
  uint32_t v = slot.version.load(std::memory_order_relaxed);
  if ((v & 1) || !slot.version.compare_exchange_strong(v, v + 1, std::memory_order_acquire))
    return;  // another writer holds the slot; skip
  std::atomic_thread_fence(std::memory_order_release);
  uint64_t w[7] = {};
  uint32_t tag = static_cast<uint32_t>(hash >> 32) | 1;
  w[0] = tag | (uint64_t(word.size()) << 32) | (uint64_t(ids.size()) << 40) |
         (uint64_t(raw_bytes) << 48);
  std::memcpy(reinterpret_cast<char*>(&w[1]), word.data(), word.size());
  std::memcpy(reinterpret_cast<char*>(&w[4]), ids.data(), ids.size() * sizeof(int32_t));
  for (int i = 0; i < 7; ++i) slot.words[i].store(w[i], std::memory_order_relaxed);
  slot.version.store(v + 2, std::memory_order_release);
}

void BpeModel::AppendSymbols(std::string_view word, bool raw_bytes,
                             std::vector<int32_t>* symbols) const {
  if (raw_bytes && continuing_subword_prefix_.empty() && end_of_word_suffix_.empty()) {
    bool pending_unk = false;
    for (unsigned char byte : word) {
      int32_t id = byte_ids_[byte];
      if (id >= 0) {
        symbols->push_back(id);
        pending_unk = false;
      } else if (unk_id_ && !(fuse_unk_ && pending_unk)) {
        symbols->push_back(*unk_id_);
        pending_unk = true;
      }
    }
    return;
  }
  std::string_view text = word;
  if (raw_bytes) {
    std::string& mapped = ThreadScratch().mapped;
    mapped.clear();
    const auto& alphabet = utf8::GetByteLevelAlphabet();
    for (unsigned char byte : word) mapped += alphabet.byte_to_utf8[byte];
    text = mapped;
  }
  bool pending_unk = false;
  std::string piece;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t begin = pos;
    utf8::Next(text, &pos);
    piece.clear();
    if (begin > 0) piece += continuing_subword_prefix_;
    piece.append(text.substr(begin, pos - begin));
    if (pos == text.size()) piece += end_of_word_suffix_;
    auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      symbols->push_back(it->second);
      pending_unk = false;
      continue;
    }
    if (byte_fallback_) {
      std::vector<int32_t> bytes;
      for (unsigned char byte : piece) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", byte);
        auto ib = vocab_.find(std::string_view(name));
        if (ib == vocab_.end()) break;
        bytes.push_back(ib->second);
      }
      if (bytes.size() == piece.size()) {
        symbols->insert(symbols->end(), bytes.begin(), bytes.end());
        pending_unk = false;
        continue;
      }
    }
    if (unk_id_ && !(fuse_unk_ && pending_unk)) {
      symbols->push_back(*unk_id_);
      pending_unk = true;
    }
  }
}

void BpeModel::MergeWord(std::vector<int32_t>* ids) const {
  size_t n = ids->size();
  if (n < 2) return;
  MergeScratch& s = ThreadScratch();
  s.symbols.resize(n);
  s.heap.clear();
  for (size_t i = 0; i < n; ++i)
    s.symbols[i] = {(*ids)[i], int32_t(i) - 1, i + 1 < n ? int32_t(i + 1) : -1, true};
  for (size_t i = 0; i + 1 < n; ++i)
    if (const Merge* m = FindMerge((*ids)[i], (*ids)[i + 1]))
      s.heap.push_back({m->rank, int32_t(i), m->new_id});
  std::make_heap(s.heap.begin(), s.heap.end());
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end());
    Candidate top = s.heap.back();
    s.heap.pop_back();
    Symbol& left = s.symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = s.symbols[left.next];
    const Merge* m = FindMerge(left.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;  // stale candidate
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) s.symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* pm = FindMerge(s.symbols[left.prev].id, left.id)) {
        s.heap.push_back({pm->rank, left.prev, pm->new_id});
        std::push_heap(s.heap.begin(), s.heap.end());
      }
    }
    if (left.next >= 0) {
      if (const Merge* nm = FindMerge(left.id, s.symbols[left.next].id)) {
        s.heap.push_back({nm->rank, top.pos, nm->new_id});
        std::push_heap(s.heap.begin(), s.heap.end());
      }
    }
  }
  ids->clear();
  for (int32_t i = 0; i >= 0; i = s.symbols[i].next) ids->push_back(s.symbols[i].id);
}

void BpeModel::Encode(std::string_view word, bool raw_bytes, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  uint64_t hash = WordHash(word);
  bool is_short = word.size() <= kShortWordBytes;
  if (is_short && LookupShort(word, hash, raw_bytes, ids)) return;
  bool cacheable = !is_short && word.size() <= kMaxCachedWordBytes;
  Shard* shard = nullptr;
  if (cacheable) {
    shard = &cache_[raw_bytes][(hash >> 20) % kNumShards];
    std::lock_guard<std::mutex> lock(shard->mu);
    auto it = shard->words.find(word);
    if (it != shard->words.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> word_ids;
  word_ids.reserve(word.size());
  bool whole = false;
  if (ignore_merges_) {
    std::string_view text = word;
    std::string mapped;
    if (raw_bytes) {
      const auto& alphabet = utf8::GetByteLevelAlphabet();
      for (unsigned char byte : word) mapped += alphabet.byte_to_utf8[byte];
      text = mapped;
    }
    auto it = vocab_.find(text);
    if (it != vocab_.end()) {
      word_ids.push_back(it->second);
      whole = true;
    }
  }
  if (!whole) {
    AppendSymbols(word, raw_bytes, &word_ids);
    MergeWord(&word_ids);
  }
  ids->insert(ids->end(), word_ids.begin(), word_ids.end());
  if (is_short && word_ids.size() <= kShortWordIds) StoreShort(word, hash, raw_bytes, word_ids);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard->mu);
    if (shard->words.size() >= kMaxEntriesPerShard) shard->words.clear();
    shard->words.emplace(std::string(word), std::move(word_ids));
  }
}

}  // namespace corolla
