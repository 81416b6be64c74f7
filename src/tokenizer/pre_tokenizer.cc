#include "tokenizer/pre_tokenizer.h"

#include <algorithm>

#include <utf8proc.h>

#include "tokenizer/utf8.h"

namespace corolla {
namespace {

// The GPT-2 word pattern that ByteLevel(use_regex=true) splits with.
constexpr char kByteLevelPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Rust's char::is_numeric: general categories Nd, Nl, No.
bool IsNumeric(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

Result<std::shared_ptr<Regex>> SharedByteLevelRegex() {
  static const Result<std::shared_ptr<Regex>> re = []() -> Result<std::shared_ptr<Regex>> {
    ASSIGN_OR_RETURN(auto compiled, Regex::Compile(kByteLevelPattern));
    return std::shared_ptr<Regex>(std::move(compiled));
  }();
  return re;
}

bool GetBool(const nlohmann::json& config, const char* key, bool fallback) {
  auto it = config.find(key);
  if (it == config.end() || !it->is_boolean()) return fallback;
  return it->get<bool>();
}

// Maps every byte of each piece to its byte-level character, in place of the pieces.
void MapBytes(PreTokenizer::Scratch* s) {
  const auto& alphabet = utf8::GetByteLevelAlphabet();
  for (auto& piece : s->pieces) {
    std::string& mapped = s->owned.emplace_back();
    mapped.reserve(piece.size() * 2);
    for (unsigned char b : piece) mapped += alphabet.byte_to_utf8[b];
    piece = mapped;
  }
}

}  // namespace

void ApplyBehavior(SplitBehavior behavior, std::vector<PreTokenizer::Scratch::Span>* spans,
                   std::vector<PreTokenizer::Scratch::Span>* out) {
  out->clear();
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& sp : *spans)
        if (!sp.is_match) out->push_back(sp);
      break;
    case SplitBehavior::kIsolated:
      *out = *spans;
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& sp : *spans) {
        if (sp.is_match && !previous_match && !out->empty()) out->back().end = sp.end;
        else out->push_back(sp);
        previous_match = sp.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans->rbegin(); it != spans->rend(); ++it) {
        if (it->is_match && !previous_match && !out->empty()) out->back().begin = it->begin;
        else out->push_back(*it);
        previous_match = it->is_match;
      }
      std::reverse(out->begin(), out->end());
      break;
    case SplitBehavior::kContiguous:
      for (const auto& sp : *spans) {
        if (sp.is_match == previous_match && !out->empty()) out->back().end = sp.end;
        else out->push_back(sp);
        previous_match = sp.is_match;
      }
      break;
  }
  std::erase_if(*out, [](const auto& sp) { return sp.begin == sp.end; });
}

Status PreTokenizer::Collect(const nlohmann::json& config, std::vector<Step>* steps) {
  if (config.is_null()) return Status::Ok();
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string())
    return Corrupt("pre_tokenizer: expected an object with a string \"type\"");
  const std::string& type = config["type"].get_ref<const std::string&>();
  if (type == "Sequence") {
    if (!config.contains("pretokenizers") || !config["pretokenizers"].is_array())
      return Corrupt("pre_tokenizer Sequence: expected a \"pretokenizers\" list");
    for (const auto& p : config["pretokenizers"]) RETURN_IF_ERROR(Collect(p, steps));
    return Status::Ok();
  }
  Step step;
  if (type == "Split") {
    step.kind = Step::Kind::kSplit;
    auto pattern = config.find("pattern");
    if (pattern == config.end() || !pattern->is_object())
      return Corrupt("pre_tokenizer Split: expected a \"pattern\" object");
    bool literal;
    std::string text;
    if (pattern->contains("Regex") && (*pattern)["Regex"].is_string()) {
      literal = false;
      text = (*pattern)["Regex"].get<std::string>();
    } else if (pattern->contains("String") && (*pattern)["String"].is_string()) {
      literal = true;
      text = (*pattern)["String"].get<std::string>();
    } else {
      return Corrupt("pre_tokenizer Split: pattern needs a string \"Regex\" or \"String\"");
    }
    ASSIGN_OR_RETURN(auto re, Regex::Compile(text, literal));
    step.regex = std::move(re);
    std::string behavior =
        config.contains("behavior") && config["behavior"].is_string() ? config["behavior"] : "";
    if (behavior == "Removed") step.behavior = SplitBehavior::kRemoved;
    else if (behavior == "Isolated") step.behavior = SplitBehavior::kIsolated;
    else if (behavior == "MergedWithPrevious") step.behavior = SplitBehavior::kMergedWithPrevious;
    else if (behavior == "MergedWithNext") step.behavior = SplitBehavior::kMergedWithNext;
    else if (behavior == "Contiguous") step.behavior = SplitBehavior::kContiguous;
    else return Corrupt("pre_tokenizer Split: unknown behavior \"" + behavior + "\"");
    step.invert = GetBool(config, "invert", false);
  } else if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
    step.add_prefix_space = GetBool(config, "add_prefix_space", true);
    if (GetBool(config, "use_regex", true)) {
      ASSIGN_OR_RETURN(step.regex, SharedByteLevelRegex());
    }
  } else if (type == "Digits") {
    step.kind = Step::Kind::kDigits;
    step.individual_digits = GetBool(config, "individual_digits", false);
  } else {
    return Unsupported("pre_tokenizer type \"" + type + "\" is not supported");
  }
  steps->push_back(std::move(step));
  return Status::Ok();
}

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::FromJson(const nlohmann::json& config) {
  auto p = std::make_unique<PreTokenizer>();
  RETURN_IF_ERROR(Collect(config, &p->steps_));
  p->maps_bytes_at_end_ = !p->steps_.empty() && p->steps_.back().kind == Step::Kind::kByteLevel;
  return p;
}

Status PreTokenizer::ApplySplit(const Step& step, Scratch* s) const {
  s->next.clear();
  for (std::string_view piece : s->pieces) {
    s->spans.clear();
    uint32_t prev = 0;
    if (step.kind == Step::Kind::kDigits) {
      // Each numeric character is a match; the characters between are one non-match.
      size_t pos = 0;
      while (pos < piece.size()) {
        size_t begin = pos;
        char32_t cp = utf8::Next(piece, &pos);
        if (!IsNumeric(cp)) continue;
        if (prev < begin) s->spans.push_back({prev, uint32_t(begin), false});
        s->spans.push_back({uint32_t(begin), uint32_t(pos), true});
        prev = static_cast<uint32_t>(pos);
      }
    } else {
      s->matches.clear();
      RETURN_IF_ERROR(step.regex->FindAll(piece, &s->matches));
      for (const auto& m : s->matches) {
        if (prev != m.begin) s->spans.push_back({prev, m.begin, false});
        s->spans.push_back({m.begin, m.end, true});
        prev = m.end;
      }
    }
    if (prev != piece.size()) s->spans.push_back({prev, uint32_t(piece.size()), false});
    if (step.invert)
      for (auto& sp : s->spans) sp.is_match = !sp.is_match;
    SplitBehavior behavior = step.behavior;
    if (step.kind == Step::Kind::kDigits)
      behavior = step.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
    if (step.kind == Step::Kind::kByteLevel) behavior = SplitBehavior::kIsolated;
    ApplyBehavior(behavior, &s->spans, &s->merged);
    for (const auto& sp : s->merged) s->next.push_back(piece.substr(sp.begin, sp.end - sp.begin));
  }
  s->pieces.swap(s->next);
  return Status::Ok();
}

Status PreTokenizer::Split(std::string_view text, Scratch* s) const {
  s->pieces.clear();
  s->owned.clear();
  if (text.empty()) return Status::Ok();
  s->pieces.push_back(text);
  bool bytes_pending = false;  // a ByteLevel step ran and its mapping is not applied yet
  for (const Step& step : steps_) {
    if (bytes_pending) {
      MapBytes(s);
      bytes_pending = false;
    }
    if (step.kind == Step::Kind::kByteLevel) {
      if (step.add_prefix_space) {
        for (auto& piece : s->pieces) {
          if (!piece.empty() && piece[0] == ' ') continue;
          std::string& spaced = s->owned.emplace_back();
          spaced.reserve(piece.size() + 1);
          spaced += ' ';
          spaced += piece;
          piece = spaced;
        }
      }
      if (step.regex != nullptr) RETURN_IF_ERROR(ApplySplit(step, s));
      bytes_pending = true;
    } else {
      RETURN_IF_ERROR(ApplySplit(step, s));
    }
  }
  return Status::Ok();
}

}  // namespace corolla
