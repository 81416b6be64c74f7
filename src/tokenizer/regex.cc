#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/utf8.h"

namespace corolla {
namespace {

constexpr char kSpaceSet[] =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";
constexpr char kWordSet[] = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
constexpr char kHexSet[] = "0-9a-fA-F";

// Per-thread match state shared by all patterns: a one-pair match block and a JIT stack large
// enough for long whitespace runs under look-ahead.
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* context = nullptr;
  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    context = pcre2_match_context_create(nullptr);
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

MatchState& ThreadMatchState() {
  thread_local MatchState state;
  return state;
}

std::string ErrorText(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<char*>(buf);
}

}  // namespace

std::string TranslateOnigPattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      const char* set = nullptr;
      bool negated = false;
      switch (e) {
        case 's': set = kSpaceSet; break;
        case 'S': set = kSpaceSet; negated = true; break;
        case 'w': set = kWordSet; break;
        case 'W': set = kWordSet; negated = true; break;
        case 'h': set = kHexSet; break;
        case 'H': set = kHexSet; negated = true; break;
        default: break;
      }
      if (set != nullptr && !in_class) {
        out += negated ? "[^" : "[";
        out += set;
        out += "]";
      } else if (set != nullptr && !negated) {
        out += set;
      } else if (set != nullptr && e == 'H') {
        out += "\\x00-/:-@G-`g-\\x{10FFFF}";  // complement of [0-9A-Fa-f]
      } else {
        // A negated class escape inside a class (rare) keeps PCRE2's meaning.
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      // POSIX class [:alpha:]: copy through its closing ':]'.
      size_t close = p.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(p.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Result<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern, bool literal) {
  std::unique_ptr<Regex> re(new Regex());
  re->pattern_ = std::string(pattern);
  std::string translated = literal ? std::string(pattern) : TranslateOnigPattern(pattern);
  if (utf8::FindInvalid(translated) != translated.size())
    return Corrupt("regex /" + re->pattern_ + "/ is not valid UTF-8");
  // PCRE2_LITERAL admits no PCRE2_UCP (which only matters to escapes anyway).
  uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options,
                    &error, &error_offset, nullptr);
  if (code == nullptr) {
    return Corrupt("regex /" + re->pattern_ + "/ does not compile (as /" + translated +
                   "/ in PCRE2): " + ErrorText(error) + " at offset " +
                   std::to_string(error_offset));
  }
  re->code_ = code;
  // Without JIT (unsupported platform) pcre2_match interprets; results are the same.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return re;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

Status Regex::FindAll(std::string_view subject, std::vector<Match>* matches) const {
  auto* code = static_cast<pcre2_code*>(code_);
  MatchState& state = ThreadMatchState();
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t n = subject.size(), start = 0;
  while (start <= n) {
    int rc = pcre2_match(code, s, n, start, PCRE2_NO_UTF_CHECK, state.data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return ResourceExhausted("regex /" + pattern_ + "/ failed on a " + std::to_string(n) +
                               "-byte piece: " + ErrorText(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.data);
    size_t b = ov[0], e = ov[1];
    matches->push_back({static_cast<uint32_t>(b), static_cast<uint32_t>(e)});
    if (e > b) {
      start = e;
    } else {
      if (b >= n) break;
      start = b + utf8::SequenceLength(s[b]);
    }
  }
  return Status::Ok();
}

}  // namespace corolla
