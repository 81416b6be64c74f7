// Tokenizer: byte-level BPE driven by a Hugging Face tokenizer.json, encoding and decoding
// exactly as the `tokenizers` library does (added tokens, normalizer, pre-tokenizer, BPE model,
// post-processor, decoder). A Tokenizer is immutable after loading and Encode/Decode are
// thread-safe (the BPE word cache is sharded under mutexes). StreamingDetokenizer turns one
// request's ids into text piece by piece; it borrows the Tokenizer and is not thread-safe.
//
// Behaviour choices where Hugging Face has none to copy:
//  - Encode rejects text that is not valid UTF-8 with InvalidArgument naming the byte offset
//    (Python strings cannot hold invalid UTF-8, so HF never sees such input).
//  - Decode and StreamingDetokenizer::Push reject ids outside the vocabulary with OutOfRange
//    (HF silently drops them).
//  - Encode(add_special_tokens=true) applies tokenizer.json's post_processor only; it does not
//    add the BOS that transformers adds from tokenizer_config.json's add_bos_token.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "tokenizer/added_vocab.h"

namespace corolla {

class BpeModel;
class Normalizer;
class PreTokenizer;

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json, and DIR/tokenizer_config.json (if present) for the names of the
  // bos/eos tokens.
  static Result<std::unique_ptr<Tokenizer>> LoadFromDir(const std::string& dir);
  static Result<std::unique_ptr<Tokenizer>> LoadFromJson(std::string_view tokenizer_json);
  ~Tokenizer();

  // Added tokens in `text` (special or not) are always matched; `add_special_tokens` applies
  // the post-processor (e.g. a BOS from TemplateProcessing).
  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens = false) const;
  // Decodes as HF does: token texts through the decoder, then invalid UTF-8 replaced by U+FFFD.
  Result<std::string> Decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }  // max id + 1
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token's text as it stands in the vocabulary (e.g. "Ġhello"), if the id has one.
  std::optional<std::string_view> IdToToken(int32_t id) const;
  bool IsSpecial(int32_t id) const;
  std::optional<int32_t> bos_token_id() const { return bos_id_; }
  std::optional<int32_t> eos_token_id() const { return eos_id_; }

  // Appends the decoded bytes of one token to *bytes (before the final UTF-8 repair), for the
  // streaming detokenizer. `*first` tracks whether a token was emitted yet (decoders that join
  // tokens with separators need it). Skipped special tokens append nothing.
  Status AppendTokenBytes(int32_t id, bool skip_special_tokens, bool* first,
                          std::string* bytes) const;

 private:
  Tokenizer();
  Status EncodeText(std::string_view text, std::vector<int32_t>* ids) const;
  Status EncodeWords(std::string_view text, std::vector<int32_t>* ids) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  AddedTokenMatcher raw_added_;         // added tokens with normalized=false
  AddedTokenMatcher normalized_added_;  // added tokens with normalized=true
  std::vector<AddedToken> added_tokens_;
  std::unordered_map<std::string, int32_t> added_ids_;  // content -> id

  // Per id: its token text ("" and !exists for holes in the id space).
  std::vector<std::string> tokens_;
  std::vector<uint8_t> flags_;  // kExists | kSpecial
  static constexpr uint8_t kExists = 1, kSpecial = 2;
  // Decoder output per id: bytes [decoded_offsets_[id], decoded_offsets_[id + 1]).
  std::string decoded_bytes_;
  std::vector<uint32_t> decoded_offsets_;
  bool join_with_spaces_ = false;  // no decoder: HF joins token texts with " "

  std::vector<int32_t> post_prefix_, post_suffix_;  // post-processor for one sequence
  std::optional<int32_t> bos_id_, eos_id_;
};

class StreamingDetokenizer {
 public:
  StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);

  // Text that is now final: complete UTF-8 that no later token can change. Concatenating every
  // Push result and Flush equals Tokenizer::Decode of all the ids.
  Result<std::string> Push(int32_t id);
  // The rest at the end of the stream (an unfinished UTF-8 sequence becomes U+FFFD).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  bool first_ = true;
  std::string pending_;  // decoded bytes not yet emitted (an incomplete UTF-8 sequence)
};

}  // namespace corolla
