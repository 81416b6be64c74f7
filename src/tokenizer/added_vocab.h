// Added tokens of tokenizer.json ("added_tokens"): found in the text before pre-tokenisation,
// leftmost-longest as Hugging Face's AddedVocabulary does, honouring single_word, lstrip and
// rstrip. Tokens with normalized=false are matched on the raw text, the others on the
// normalised text. Immutable after construction; Split is thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace corolla {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// Finds occurrences of a set of added tokens in text.
class AddedTokenMatcher {
 public:
  // `patterns[i]` is the text to look for and `tokens[i]` the token it stands for.
  AddedTokenMatcher(std::vector<std::string> patterns, std::vector<AddedToken> tokens);
  AddedTokenMatcher() = default;

  bool empty() const { return tokens_.empty(); }

  struct Segment {
    uint32_t begin, end;
    int32_t id;  // the added token's id, or -1 for text between tokens
  };
  // Cuts `text` into text segments and added-token segments (appended to *segments, in order,
  // covering the text except whitespace that lstrip/rstrip swallow into a token segment).
  void Split(std::string_view text, std::vector<Segment>* segments) const;

 private:
  // Length of the longest pattern starting at text[pos] and its index, or {0, -1}.
  std::pair<size_t, int32_t> LongestAt(std::string_view text, size_t pos) const;

  // A byte trie: node 0 is the root; edges_ maps (node << 8 | byte) to the child.
  std::unordered_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> terminal_;  // per node: pattern index ending here, or -1
  bool first_byte_[256] = {};
  std::vector<AddedToken> tokens_;
};

}  // namespace corolla
