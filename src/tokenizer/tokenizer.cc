#include "tokenizer/tokenizer.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace corolla {
namespace {

using nlohmann::json;

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path);
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return Corrupt("cannot read " + path);
  return s.str();
}

bool GetBool(const json& config, const char* key, bool fallback) {
  auto it = config.find(key);
  return it != config.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

Result<std::vector<AddedToken>> ParseAddedTokens(const json& config) {
  std::vector<AddedToken> tokens;
  if (config.is_null()) return tokens;
  if (!config.is_array()) return Corrupt("added_tokens: expected a list");
  for (const auto& t : config) {
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        !t.contains("content") || !t["content"].is_string())
      return Corrupt("added_tokens: every entry needs an integer \"id\" and a string \"content\"");
    int64_t id = t["id"].get<int64_t>();
    if (id < 0 || id > INT32_MAX)
      return Corrupt("added_tokens: id " + std::to_string(id) + " is out of range");
    AddedToken token;
    token.id = static_cast<int32_t>(id);
    token.content = t["content"].get<std::string>();
    token.special = GetBool(t, "special", false);
    token.single_word = GetBool(t, "single_word", false);
    token.lstrip = GetBool(t, "lstrip", false);
    token.rstrip = GetBool(t, "rstrip", false);
    token.normalized = GetBool(t, "normalized", true);
    tokens.push_back(std::move(token));
  }
  return tokens;
}

// Collects the ids a post-processor puts before and after the sequence.
Status ParsePostProcessor(const json& config, std::vector<int32_t>* prefix,
                          std::vector<int32_t>* suffix) {
  if (config.is_null()) return Status::Ok();
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string())
    return Corrupt("post_processor: expected an object with a string \"type\"");
  const std::string& type = config["type"].get_ref<const std::string&>();
  std::vector<int32_t> pre, post;
  if (type == "ByteLevel") {
    return Status::Ok();  // only trims offsets
  } else if (type == "Sequence") {
    if (!config.contains("processors") || !config["processors"].is_array())
      return Corrupt("post_processor Sequence: expected a \"processors\" list");
    for (const auto& p : config["processors"]) RETURN_IF_ERROR(ParsePostProcessor(p, prefix, suffix));
    return Status::Ok();
  } else if (type == "TemplateProcessing") {
    auto single = config.find("single");
    auto specials = config.find("special_tokens");
    if (single == config.end() || !single->is_array())
      return Corrupt("post_processor TemplateProcessing: expected a \"single\" list");
    bool seen_sequence = false;
    for (const auto& piece : *single) {
      if (piece.is_object() && piece.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      if (!piece.is_object() || !piece.contains("SpecialToken") ||
          !piece["SpecialToken"].is_object() || !piece["SpecialToken"].contains("id") ||
          !piece["SpecialToken"]["id"].is_string())
        return Corrupt("post_processor TemplateProcessing: bad item in \"single\"");
      std::string name = piece["SpecialToken"]["id"].get<std::string>();
      if (specials == config.end() || !specials->is_object() || !specials->contains(name) ||
          !(*specials)[name].is_object() || !(*specials)[name].contains("ids") ||
          !(*specials)[name]["ids"].is_array())
        return Corrupt("post_processor TemplateProcessing: special token \"" + name +
                       "\" has no ids");
      for (const auto& id : (*specials)[name]["ids"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
          return Corrupt("post_processor TemplateProcessing: bad id for \"" + name + "\"");
        (seen_sequence ? post : pre).push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    }
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    for (const char* key : {"cls", "sep"}) {
      auto it = config.find(key);
      if (it == config.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer())
        return Corrupt("post_processor " + type + ": expected \"" + key + "\": [token, id]");
      (std::string(key) == "cls" ? pre : post).push_back((*it)[1].get<int32_t>());
    }
  } else {
    return Unsupported("post_processor type \"" + type + "\" is not supported");
  }
  prefix->insert(prefix->begin(), pre.begin(), pre.end());
  suffix->insert(suffix->end(), post.begin(), post.end());
  return Status::Ok();
}

// Whether the decoder is ByteLevel (true) or absent (false); anything else is Unsupported.
Result<bool> ParseDecoder(const json& config) {
  if (config.is_null()) return false;
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string())
    return Corrupt("decoder: expected an object with a string \"type\"");
  const std::string& type = config["type"].get_ref<const std::string&>();
  if (type == "ByteLevel") return true;
  if (type == "Sequence" && config.contains("decoders") && config["decoders"].is_array() &&
      config["decoders"].size() == 1)
    return ParseDecoder(config["decoders"][0]);
  return Unsupported("decoder type \"" + type + "\" is not supported");
}

// The ByteLevel decoder's bytes for one token: each character back to its byte, or the token's
// own UTF-8 when some character is not in the byte-level alphabet.
void ByteLevelDecode(std::string_view token, std::string* out) {
  const auto& alphabet = utf8::GetByteLevelAlphabet();
  size_t start = out->size(), pos = 0;
  while (pos < token.size()) {
    char32_t cp = utf8::Next(token, &pos);
    if (cp >= alphabet.char_to_byte.size() || alphabet.char_to_byte[cp] < 0) {
      out->resize(start);
      out->append(token);
      return;
    }
    out->push_back(static_cast<char>(alphabet.char_to_byte[cp]));
  }
}

// tokenizer_config.json names tokens as a string or as {"content": ...}.
std::optional<std::string> TokenName(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::LoadFromDir(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(dir + "/tokenizer.json"));
  auto loaded = LoadFromJson(text);
  if (!loaded.ok()) return loaded.status().WithContext(dir + "/tokenizer.json");
  std::unique_ptr<Tokenizer> tok = std::move(loaded).value();
  auto config_text = ReadFile(dir + "/tokenizer_config.json");
  if (config_text.ok()) {
    json config = json::parse(*config_text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object())
      return Corrupt(dir + "/tokenizer_config.json: not a JSON object");
    if (auto bos = TokenName(config, "bos_token")) tok->bos_id_ = tok->TokenToId(*bos);
    if (auto eos = TokenName(config, "eos_token")) tok->eos_id_ = tok->TokenToId(*eos);
  }
  return tok;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::LoadFromJson(std::string_view tokenizer_json) {
  json root;
  try {
    root = json::parse(tokenizer_json);
  } catch (const json::exception& e) {
    return Corrupt(std::string("tokenizer.json does not parse: ") + e.what());
  }
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  try {
    if (!root.is_object()) return Corrupt("tokenizer.json: expected a JSON object");
    auto field = [&](const char* key) -> const json& {
      static const json kNull;
      auto it = root.find(key);
      return it == root.end() ? kNull : *it;
    };
    if (!field("model").is_object()) return Corrupt("tokenizer.json: no \"model\" object");
    ASSIGN_OR_RETURN(tok->model_, BpeModel::FromJson(field("model")));
    ASSIGN_OR_RETURN(tok->normalizer_, Normalizer::FromJson(field("normalizer")));
    ASSIGN_OR_RETURN(tok->pre_tokenizer_, PreTokenizer::FromJson(field("pre_tokenizer")));
    ASSIGN_OR_RETURN(tok->added_tokens_, ParseAddedTokens(field("added_tokens")));
    RETURN_IF_ERROR(ParsePostProcessor(field("post_processor"), &tok->post_prefix_,
                                       &tok->post_suffix_));
    ASSIGN_OR_RETURN(bool byte_level_decoder, ParseDecoder(field("decoder")));
    tok->join_with_spaces_ = !byte_level_decoder;
  } catch (const json::exception& e) {
    return Corrupt(std::string("tokenizer.json: ") + e.what());
  }

  // Id space: the model's vocabulary, then added tokens (which win where both name an id).
  int64_t max_id = -1;
  for (const auto& [text, id] : tok->model_->vocab()) max_id = std::max<int64_t>(max_id, id);
  for (const auto& t : tok->added_tokens_) max_id = std::max<int64_t>(max_id, t.id);
  // Ids index dense tables; a sparse id space (a typo, or a hostile file) would waste memory.
  int64_t num_entries = static_cast<int64_t>(tok->model_->vocab().size() + tok->added_tokens_.size());
  if (max_id >= (int64_t(1) << 24) || max_id > 2 * num_entries + 65536)
    return Corrupt("tokenizer.json: token id " + std::to_string(max_id) + " is implausibly large for " +
                   std::to_string(num_entries) + " tokens");
  tok->tokens_.assign(max_id + 1, std::string());
  tok->flags_.assign(max_id + 1, 0);
  for (const auto& [text, id] : tok->model_->vocab()) {
    tok->tokens_[id] = text;
    tok->flags_[id] = kExists;
  }
  for (const auto& t : tok->added_tokens_) {
    tok->added_ids_.emplace(t.content, t.id);
    tok->tokens_[t.id] = t.content;
    tok->flags_[t.id] = kExists | (t.special ? kSpecial : 0);
  }
  for (const auto& p : tok->post_prefix_)
    if (p >= tok->vocab_size()) return Corrupt("post_processor: id " + std::to_string(p) + " is not in the vocabulary");
  for (const auto& p : tok->post_suffix_)
    if (p >= tok->vocab_size()) return Corrupt("post_processor: id " + std::to_string(p) + " is not in the vocabulary");

  // Added-token matchers: normalized tokens are looked for in normalised text, so their
  // patterns are normalised too.
  std::vector<std::string> raw_patterns, norm_patterns;
  std::vector<AddedToken> raw_tokens, norm_tokens;
  for (const auto& t : tok->added_tokens_) {
    if (utf8::FindInvalid(t.content) != t.content.size())
      return Corrupt("added token " + std::to_string(t.id) + " is not valid UTF-8");
    if (t.normalized) {
      std::string normalized;
      norm_patterns.push_back(tok->normalizer_->Normalize(t.content, &normalized) ? normalized
                                                                                 : t.content);
      norm_tokens.push_back(t);
    } else {
      raw_patterns.push_back(t.content);
      raw_tokens.push_back(t);
    }
  }
  tok->raw_added_ = AddedTokenMatcher(std::move(raw_patterns), std::move(raw_tokens));
  tok->normalized_added_ = AddedTokenMatcher(std::move(norm_patterns), std::move(norm_tokens));

  // Decoder output of every token.
  tok->decoded_offsets_.reserve(tok->tokens_.size() + 1);
  tok->decoded_offsets_.push_back(0);
  for (const auto& text : tok->tokens_) {
    if (tok->join_with_spaces_) tok->decoded_bytes_ += text;
    else ByteLevelDecode(text, &tok->decoded_bytes_);
    tok->decoded_offsets_.push_back(static_cast<uint32_t>(tok->decoded_bytes_.size()));
  }
  return tok;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto added = added_ids_.find(std::string(token)); added != added_ids_.end())
    return added->second;
  auto it = model_->vocab().find(token);
  if (it == model_->vocab().end()) return std::nullopt;
  return it->second;
}

std::optional<std::string_view> Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !(flags_[id] & kExists)) return std::nullopt;
  return tokens_[id];
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && (flags_[id] & kSpecial);
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                               bool add_special_tokens) const {
  if (size_t bad = utf8::FindInvalid(text); bad != text.size()) {
    char byte[8];
    std::snprintf(byte, sizeof(byte), "0x%02X", static_cast<unsigned char>(text[bad]));
    return InvalidArgument("text to encode is not valid UTF-8: byte " + std::string(byte) +
                           " at offset " + std::to_string(bad));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids = post_prefix_;
  if (raw_added_.empty()) {
    RETURN_IF_ERROR(EncodeText(text, &ids));
  } else {
    std::vector<AddedTokenMatcher::Segment> segments;
    raw_added_.Split(text, &segments);
    for (const auto& seg : segments) {
      if (seg.id >= 0) ids.push_back(seg.id);
      else RETURN_IF_ERROR(EncodeText(text.substr(seg.begin, seg.end - seg.begin), &ids));
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), post_suffix_.begin(), post_suffix_.end());
  return ids;
}

Status Tokenizer::EncodeText(std::string_view text, std::vector<int32_t>* ids) const {
  std::string normalized_buffer;
  std::string_view normalized =
      normalizer_->Normalize(text, &normalized_buffer) ? normalized_buffer : text;
  if (normalized_added_.empty()) return EncodeWords(normalized, ids);
  std::vector<AddedTokenMatcher::Segment> segments;
  normalized_added_.Split(normalized, &segments);
  for (const auto& seg : segments) {
    if (seg.id >= 0) ids->push_back(seg.id);
    else RETURN_IF_ERROR(EncodeWords(normalized.substr(seg.begin, seg.end - seg.begin), ids));
  }
  return Status::Ok();
}

Status Tokenizer::EncodeWords(std::string_view text, std::vector<int32_t>* ids) const {
  thread_local PreTokenizer::Scratch scratch;
  RETURN_IF_ERROR(pre_tokenizer_->Split(text, &scratch));
  bool raw_bytes = pre_tokenizer_->maps_bytes_at_end();
  for (std::string_view piece : scratch.pieces) model_->Encode(piece, raw_bytes, ids);
  return Status::Ok();
}

Status Tokenizer::AppendTokenBytes(int32_t id, bool skip_special_tokens, bool* first,
                                   std::string* bytes) const {
  if (id < 0 || id >= vocab_size() || !(flags_[id] & kExists))
    return OutOfRange("token id " + std::to_string(id) + " is outside the vocabulary (size " +
                      std::to_string(vocab_size()) + ")");
  if (skip_special_tokens && (flags_[id] & kSpecial)) return Status::Ok();
  if (join_with_spaces_ && !*first) bytes->push_back(' ');
  *first = false;
  bytes->append(decoded_bytes_, decoded_offsets_[id], decoded_offsets_[id + 1] - decoded_offsets_[id]);
  return Status::Ok();
}

Result<std::string> Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  bool first = true;
  for (int32_t id : ids) RETURN_IF_ERROR(AppendTokenBytes(id, skip_special_tokens, &first, &bytes));
  if (utf8::FindInvalid(bytes) == bytes.size()) return bytes;
  std::string text;
  text.reserve(bytes.size() + 8);
  utf8::AppendLossy(bytes, /*final=*/true, &text);
  return text;
}

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

Result<std::string> StreamingDetokenizer::Push(int32_t id) {
  RETURN_IF_ERROR(tokenizer_.AppendTokenBytes(id, skip_special_tokens_, &first_, &pending_));
  std::string text;
  size_t consumed = utf8::AppendLossy(pending_, /*final=*/false, &text);
  pending_.erase(0, consumed);
  return text;
}

std::string StreamingDetokenizer::Flush() {
  std::string text;
  utf8::AppendLossy(pending_, /*final=*/true, &text);
  pending_.clear();
  return text;
}

}  // namespace corolla
