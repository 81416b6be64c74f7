// Pre-tokenizers of tokenizer.json ("pre_tokenizer"): Split (regex or literal, every split
// behaviour, invert), ByteLevel (add_prefix_space, use_regex), Digits, and Sequence of them.
// They cut a normalised text segment into the pieces ("words") that the BPE model encodes.
// A PreTokenizer is immutable after FromJson; Split is thread-safe (scratch is the caller's).
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "tokenizer/regex.h"

namespace corolla {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  // `config`: the "pre_tokenizer" object (null means the whole segment is one piece).
  static Result<std::unique_ptr<PreTokenizer>> FromJson(const nlohmann::json& config);

  // Per-call working memory; reuse it across calls on one thread to avoid allocations.
  struct Scratch {
    std::vector<std::string_view> pieces, next;
    std::vector<Regex::Match> matches;
    struct Span {
      uint32_t begin, end;
      bool is_match;
    };
    std::vector<Span> spans, merged;
    std::deque<std::string> owned;  // text the steps rewrote (prefix spaces, byte mapping)
  };

  // Cuts `text` into non-empty pieces (views into `text` or into scratch->owned), appended to
  // scratch->pieces. When maps_bytes_at_end() the pieces are raw bytes still to be mapped
  // through the byte-level alphabet; otherwise they are exactly the strings the model sees.
  Status Split(std::string_view text, Scratch* scratch) const;

  // Whether the last step is a ByteLevel mapping left to the model (the fast path).
  bool maps_bytes_at_end() const { return maps_bytes_at_end_; }

 private:
  struct Step {
    enum class Kind { kSplit, kByteLevel, kDigits } kind;
    std::shared_ptr<Regex> regex;  // kSplit, kByteLevel with use_regex
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // kByteLevel
    bool individual_digits = false;  // kDigits
  };
  static Status Collect(const nlohmann::json& config, std::vector<Step>* steps);
  Status ApplySplit(const Step& step, Scratch* s) const;

  std::vector<Step> steps_;
  bool maps_bytes_at_end_ = false;
};

// Turns a list of match/non-match spans covering a piece into the pieces that `behavior` keeps
// (Hugging Face's SplitDelimiterBehavior). Empty spans are dropped.
void ApplyBehavior(SplitBehavior behavior, std::vector<PreTokenizer::Scratch::Span>* spans,
                   std::vector<PreTokenizer::Scratch::Span>* out);

}  // namespace corolla
