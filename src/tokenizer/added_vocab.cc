#include "tokenizer/added_vocab.h"

#include <algorithm>
#include <cctype>

#include <utf8proc.h>

#include "tokenizer/utf8.h"

namespace corolla {
namespace {

// A word character as the regex \w of Hugging Face's single_word check: letters, marks,
// decimal digits, connector punctuation.
bool IsWordChar(char32_t cp) {
  if (cp < 0x80) return std::isalnum(static_cast<int>(cp)) || cp == '_';
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return cp == 0x200C || cp == 0x200D;
  }
}

// The code point that ends at text[end) (text is valid UTF-8, end > 0).
char32_t PreviousChar(std::string_view text, size_t end, size_t* begin) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
  *begin = b;
  size_t pos = b;
  return utf8::Next(text, &pos);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<std::string> patterns,
                                     std::vector<AddedToken> tokens)
    : tokens_(std::move(tokens)) {
  terminal_.push_back(-1);
  for (size_t i = 0; i < patterns.size(); ++i) {
    const std::string& p = patterns[i];
    if (p.empty()) continue;
    int32_t node = 0;
    for (unsigned char byte : p) {
      uint64_t key = (uint64_t(node) << 8) | byte;
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        int32_t child = static_cast<int32_t>(terminal_.size());
        terminal_.push_back(-1);
        it = edges_.emplace(key, child).first;
      }
      node = it->second;
    }
    // A duplicate pattern keeps the first token, as the Aho-Corasick automaton does.
    if (terminal_[node] < 0) terminal_[node] = static_cast<int32_t>(i);
    first_byte_[static_cast<unsigned char>(p[0])] = true;
  }
}

std::pair<size_t, int32_t> AddedTokenMatcher::LongestAt(std::string_view text, size_t pos) const {
  std::pair<size_t, int32_t> best{0, -1};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = edges_.find((uint64_t(node) << 8) | static_cast<unsigned char>(text[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[node] >= 0) best = {i + 1 - pos, terminal_[node]};
  }
  return best;
}

void AddedTokenMatcher::Split(std::string_view text, std::vector<Segment>* segments) const {
  size_t start_offset = 0;  // end of the last emitted segment
  size_t pos = 0;           // where the search for the next match resumes
  while (pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    auto [len, index] = LongestAt(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + len;
    pos = stop;  // matches do not overlap
    const AddedToken& token = tokens_[index];
    if (token.single_word) {
      bool start_ok = true, stop_ok = true;
      if (start > 0) {
        size_t b;
        start_ok = !IsWordChar(PreviousChar(text, start, &b));
      }
      if (stop < text.size()) {
        size_t p = stop;
        stop_ok = !IsWordChar(utf8::Next(text, &p));
      }
      if (!start_ok || !stop_ok) continue;
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t b;
        if (!utf8::IsWhitespace(PreviousChar(text, new_start, &b))) break;
        new_start = b;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t p = stop;
        if (!utf8::IsWhitespace(utf8::Next(text, &p))) break;
        stop = p;
      }
    }
    if (start_offset < start)
      segments->push_back({uint32_t(start_offset), uint32_t(start), -1});
    segments->push_back({uint32_t(start), uint32_t(stop), token.id});
    start_offset = stop;
  }
  if (start_offset < text.size())
    segments->push_back({uint32_t(start_offset), uint32_t(text.size()), -1});
}

}  // namespace corolla
