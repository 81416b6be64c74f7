#include "tokenizer/utf8.h"

namespace corolla::utf8 {
namespace {

// Valid range of the second byte after lead byte `b` (Unicode Table 3-7); the bytes after it
// are always 0x80..0xBF.
inline void SecondByteRange(unsigned char b, unsigned char* lo, unsigned char* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (b == 0xE0) *lo = 0xA0;
  else if (b == 0xED) *hi = 0x9F;
  else if (b == 0xF0) *lo = 0x90;
  else if (b == 0xF4) *hi = 0x8F;
}

// Length of the sequence at s[0] if lead byte is valid (0xC2..0xF4), else 0.
inline size_t ExpectedLength(unsigned char b) {
  if (b < 0xC2) return 0;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  if (b < 0xF5) return 4;
  return 0;
}

// How many bytes of s[0..n) form a valid (possibly incomplete) prefix of the sequence whose lead
// is s[0]; sets *complete when the whole sequence is there.
inline size_t ValidPrefix(const unsigned char* s, size_t n, bool* complete) {
  *complete = false;
  size_t len = ExpectedLength(s[0]);
  if (len == 0) return 0;
  size_t i = 1;
  for (; i < len && i < n; ++i) {
    unsigned char lo = 0x80, hi = 0xBF;
    if (i == 1) SecondByteRange(s[0], &lo, &hi);
    if (s[i] < lo || s[i] > hi) return i;
  }
  *complete = i == len;
  return i;
}

}  // namespace

size_t FindInvalid(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t n = text.size(), i = 0;
  while (i < n) {
    // Eight ASCII bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    bool complete;
    size_t len = ValidPrefix(s + i, n - i, &complete);
    if (!complete) return i;
    i += len;
  }
  return n;
}

void Append(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t AppendLossy(std::string_view bytes, bool final, std::string* out) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size(), i = 0, run_start = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    bool complete;
    size_t len = ValidPrefix(s + i, n - i, &complete);
    if (complete) {
      i += len;
      continue;
    }
    // Incomplete at the very end: may still become valid.
    if (len > 0 && i + len == n && !final) {
      out->append(bytes.data() + run_start, i - run_start);
      return i;
    }
    out->append(bytes.data() + run_start, i - run_start);
    out->append(kReplacement, 3);
    i += len == 0 ? 1 : len;
    run_start = i;
  }
  out->append(bytes.data() + run_start, n - run_start);
  return n;
}

bool IsWhitespace(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

const ByteLevelAlphabet& GetByteLevelAlphabet() {
  static const ByteLevelAlphabet alphabet = [] {
    ByteLevelAlphabet a;
    a.char_to_byte.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      a.byte_to_char[b] = printable ? char32_t(b) : next++;
      Append(a.byte_to_char[b], &a.byte_to_utf8[b]);
      a.char_to_byte[a.byte_to_char[b]] = static_cast<int16_t>(b);
    }
    return a;
  }();
  return alphabet;
}

}  // namespace corolla::utf8
