// UTF-8 helpers for the tokenizer: validation with the offending byte offset, lossy decoding
// with the replacement rules of Rust's String::from_utf8_lossy (one U+FFFD per maximal invalid
// subpart), code point iteration, and the GPT-2 byte-level alphabet (each byte <-> one printable
// code point). Stateless functions and immutable tables; thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace corolla::utf8 {

// Returns the byte offset of the first invalid sequence, or text.size() if `text` is valid.
size_t FindInvalid(std::string_view text);

// Decodes one code point at text[*pos] (text must be valid UTF-8) and advances *pos.
inline char32_t Next(std::string_view text, size_t* pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data()) + *pos;
  unsigned char b = s[0];
  if (b < 0x80) {
    *pos += 1;
    return b;
  }
  if (b < 0xE0) {
    *pos += 2;
    return (char32_t(b & 0x1F) << 6) | (s[1] & 0x3F);
  }
  if (b < 0xF0) {
    *pos += 3;
    return (char32_t(b & 0x0F) << 12) | (char32_t(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
  }
  *pos += 4;
  return (char32_t(b & 0x07) << 18) | (char32_t(s[1] & 0x3F) << 12) |
         (char32_t(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

// Length in bytes of the sequence that starts with lead byte `b` (1 for invalid leads).
inline size_t SequenceLength(unsigned char b) {
  return b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : b < 0xF8 ? 4 : 1;
}

void Append(char32_t cp, std::string* out);

// Appends `bytes` to *out as valid UTF-8, replacing each maximal invalid subpart by U+FFFD.
// With final == false, a trailing sequence that is incomplete but could still become valid is
// left unconsumed. Returns the number of bytes consumed.
size_t AppendLossy(std::string_view bytes, bool final, std::string* out);

// Rust's char::is_whitespace (the Unicode White_Space property).
bool IsWhitespace(char32_t cp);

// The GPT-2 byte-level alphabet: bytes 0x21..0x7E, 0xA1..0xAC and 0xAE..0xFF stand for
// themselves; the other 68 bytes map, in order, to U+0100, U+0101, ...
struct ByteLevelAlphabet {
  std::array<char32_t, 256> byte_to_char;
  std::array<std::string, 256> byte_to_utf8;  // byte_to_char encoded as UTF-8
  // Inverse, for code points below 0x144; -1 where a code point is no byte.
  std::array<int16_t, 0x144> char_to_byte;
};
const ByteLevelAlphabet& GetByteLevelAlphabet();

}  // namespace corolla::utf8
