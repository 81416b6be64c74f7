#include "tokenizer/normalizer.h"

#include <cstdlib>

#include <utf8proc.h>

#include "tokenizer/utf8.h"

namespace corolla {
namespace {

Status Collect(const nlohmann::json& config, std::vector<Normalizer::Form>* forms) {
  if (config.is_null()) return Status::Ok();
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string())
    return Corrupt("normalizer: expected an object with a string \"type\"");
  const std::string& type = config["type"].get_ref<const std::string&>();
  if (type == "Sequence") {
    if (!config.contains("normalizers") || !config["normalizers"].is_array())
      return Corrupt("normalizer Sequence: expected a \"normalizers\" list");
    for (const auto& n : config["normalizers"]) RETURN_IF_ERROR(Collect(n, forms));
  } else if (type == "NFC") {
    forms->push_back(Normalizer::Form::kNFC);
  } else if (type == "NFD") {
    forms->push_back(Normalizer::Form::kNFD);
  } else if (type == "NFKC") {
    forms->push_back(Normalizer::Form::kNFKC);
  } else if (type == "NFKD") {
    forms->push_back(Normalizer::Form::kNFKD);
  } else {
    return Unsupported("normalizer type \"" + type + "\" is not supported");
  }
  return Status::Ok();
}

// True when no byte could start a code point at or above U+0300: every such text is already in
// all four normal forms except NFK* of U+00A0..U+02FF compatibility characters.
bool BelowCombiningMarks(std::string_view text) {
  for (unsigned char c : text)
    if (c >= 0xCC) return false;
  return true;
}

// Characters after which NFC could differ from the input: those with a nonzero combining class,
// those with a canonical decomposition (Hangul syllables, decomposed algorithmically, are
// composed already),
// and every non-initial character of a canonical decomposition (the ones that compose with what
// precedes them, Hangul vowel and trailing jamo included). Code points from U+30000 hold none.
class NfcUnsafeSet {
 public:
  NfcUnsafeSet() : bits_(kLimit / 64, 0) {
    // Hangul vowel and trailing jamo compose algorithmically with what precedes them.
    for (utf8proc_int32_t cp = 0x1161; cp <= 0x1175; ++cp) Set(cp);
    for (utf8proc_int32_t cp = 0x11A8; cp <= 0x11C2; ++cp) Set(cp);
    utf8proc_int32_t buf[8];
    for (utf8proc_int32_t cp = 0; cp < kLimit; ++cp) {
      const utf8proc_property_t* p = utf8proc_get_property(cp);
      if (p->combining_class != 0) Set(cp);
      if (p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0) continue;  // no canonical one
      int options = 0;
      utf8proc_ssize_t n = utf8proc_decompose_char(
          cp, buf, 8, static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE), &options);
      if (n <= 0 || (n == 1 && buf[0] == cp)) continue;
      Set(cp);
      for (utf8proc_ssize_t i = 1; i < n && i < 8; ++i) Set(buf[i]);
    }
  }
  bool Contains(char32_t cp) const {
    return cp < kLimit && ((bits_[cp >> 6] >> (cp & 63)) & 1);
  }

 private:
  static constexpr utf8proc_int32_t kLimit = 0x30000;
  void Set(utf8proc_int32_t cp) {
    if (cp >= 0 && cp < kLimit) bits_[cp >> 6] |= uint64_t(1) << (cp & 63);
  }
  std::vector<uint64_t> bits_;
};

// True when NFC(text) == text for certain (false means: run the normaliser).
bool QuickNfc(std::string_view text) {
  static const NfcUnsafeSet unsafe;
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0xCC) {
      ++pos;
      continue;
    }
    if (unsafe.Contains(utf8::Next(text, &pos))) return false;
  }
  return true;
}

bool AsciiOnly(std::string_view text) {
  for (unsigned char c : text)
    if (c >= 0x80) return false;
  return true;
}

}  // namespace

Result<std::unique_ptr<Normalizer>> Normalizer::FromJson(const nlohmann::json& config) {
  auto n = std::make_unique<Normalizer>();
  RETURN_IF_ERROR(Collect(config, &n->forms_));
  return n;
}

bool Normalizer::Normalize(std::string_view text, std::string* out) const {
  std::string current;
  bool changed = false;
  for (Form form : forms_) {
    std::string_view in = changed ? std::string_view(current) : text;
    bool compat = form == Form::kNFKC || form == Form::kNFKD;
    if (compat ? AsciiOnly(in) : BelowCombiningMarks(in)) continue;
    if (form == Form::kNFC && QuickNfc(in)) continue;
    int options = UTF8PROC_STABLE;
    switch (form) {
      case Form::kNFC: options |= UTF8PROC_COMPOSE; break;
      case Form::kNFD: options |= UTF8PROC_DECOMPOSE; break;
      case Form::kNFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
      case Form::kNFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t* result = nullptr;
    utf8proc_ssize_t len =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(in.data()),
                     static_cast<utf8proc_ssize_t>(in.size()), &result,
                     static_cast<utf8proc_option_t>(options));
    if (len < 0) continue;  // input is validated UTF-8 upstream; keep it as it is
    std::string_view mapped(reinterpret_cast<const char*>(result), static_cast<size_t>(len));
    if (mapped != in) {
      current.assign(mapped);
      changed = true;
    }
    std::free(result);
  }
  if (changed) *out = std::move(current);
  return changed;
}

}  // namespace corolla
