// The BPE model of tokenizer.json ("model": {"type": "BPE"}): vocabulary, merge ranks, and a
// word-level cache so a repeated pre-token costs one hash lookup. Words are merged as Hugging
// Face does: repeatedly the adjacent pair with the lowest merge rank, leftmost first.
// A BpeModel is immutable after FromJson except for its word caches: short words live in a
// lossy direct-mapped table whose slots are seqlocks (lock-free reads), longer ones in maps
// sharded under mutexes. Encode is thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace corolla {

// Hash for std::string keys that also accepts std::string_view lookups without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const;
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // `config`: the "model" object. Only "BPE" is supported; dropout must be null/0.
  static Result<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& config);

  // Appends the ids of one pre-token. With `raw_bytes`, `word` is raw bytes that stand for their
  // byte-level characters (the ByteLevel pre-tokenizer's mapping, applied here without building
  // the mapped string); otherwise `word` is the model's own text.
  void Encode(std::string_view word, bool raw_bytes, std::vector<int32_t>* ids) const;

  const StringIdMap& vocab() const { return vocab_; }
  std::optional<int32_t> unk_id() const { return unk_id_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  }
  const Merge* FindMerge(int32_t a, int32_t b) const {
    uint64_t key = PairKey(a, b);
    for (size_t i = MergeSlot(key);; i = (i + 1) & merge_mask_) {
      const MergeEntry& e = merge_table_[i];
      if (e.key == key) return &e.merge;
      if (e.key == kEmptyKey) return nullptr;
    }
  }
  size_t MergeSlot(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 32) & merge_mask_;
  }
  void InsertMerge(uint64_t key, Merge merge);
  bool LookupShort(std::string_view word, uint64_t hash, bool raw_bytes,
                   std::vector<int32_t>* ids) const;
  void StoreShort(std::string_view word, uint64_t hash, bool raw_bytes,
                  const std::vector<int32_t>& ids) const;
  void AppendSymbols(std::string_view word, bool raw_bytes, std::vector<int32_t>* symbols) const;
  void MergeWord(std::vector<int32_t>* symbols) const;

  StringIdMap vocab_;
  // Merges: open addressing with linear probing, at most half full.
  static constexpr uint64_t kEmptyKey = ~uint64_t(0);
  struct MergeEntry {
    uint64_t key = kEmptyKey;
    Merge merge{};
  };
  std::vector<MergeEntry> merge_table_;
  size_t merge_mask_ = 0;
  std::array<int32_t, 256> byte_ids_;  // id of each byte's byte-level character, or -1
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;

  // Short-word cache: a word of up to kShortWordBytes bytes with up to kShortWordIds ids fills
  // one 64-byte slot, written as 7 atomic words under the slot's version counter (odd while a
  // writer holds it). A colliding word overwrites the slot.
  static constexpr size_t kShortWordBytes = 24;
  static constexpr size_t kShortWordIds = 6;
  static constexpr size_t kNumShortSlots = size_t(1) << 16;
  struct alignas(64) ShortSlot {
    std::atomic<uint32_t> version{0};
    // [0]: tag (hash bits, 0 = empty) | key_len << 32 | num_ids << 40 | raw_bytes << 48;
    // [1..3]: key bytes; [4..6]: ids.
    std::atomic<uint64_t> words[7];
  };
  static_assert(kShortWordBytes <= 3 * 8 && kShortWordIds * 4 <= 3 * 8 && sizeof(ShortSlot) == 64);
  std::unique_ptr<ShortSlot[]> short_cache_;

  // Longer words up to kMaxCachedWordBytes; a full shard is cleared.
  static constexpr size_t kNumShards = 64;
  static constexpr size_t kMaxEntriesPerShard = 8192;
  static constexpr size_t kMaxCachedWordBytes = 256;
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
  };
  std::unique_ptr<Shard[]> cache_[2];  // [raw_bytes]
};

}  // namespace corolla
