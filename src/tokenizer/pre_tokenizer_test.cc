// Unit tests of the pieces under the tokenizer: UTF-8 helpers, the Oniguruma-to-PCRE2 regex
// translation and iteration, and the Split behaviours.
#include "tokenizer/pre_tokenizer.h"

#include <gtest/gtest.h>

#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace corolla {
namespace {

std::vector<std::string> Pieces(const nlohmann::json& config, std::string_view text) {
  auto pre = PreTokenizer::FromJson(config);
  if (!pre.ok()) {
    ADD_FAILURE() << pre.status().ToString();
    return {};
  }
  PreTokenizer::Scratch scratch;
  auto status = (*pre)->Split(text, &scratch);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return {scratch.pieces.begin(), scratch.pieces.end()};
}

nlohmann::json SplitConfig(const std::string& regex, const std::string& behavior, bool invert) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", behavior},
          {"invert", invert}};
}

using V = std::vector<std::string>;

TEST(SplitTest, Behaviors) {
  EXPECT_EQ(Pieces(SplitConfig("-", "Removed", false), "a-b--c"), (V{"a", "b", "c"}));
  EXPECT_EQ(Pieces(SplitConfig("-", "Isolated", false), "a-b--c"),
            (V{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(Pieces(SplitConfig("-", "MergedWithPrevious", false), "a-b--c"),
            (V{"a-", "b-", "-", "c"}));
  EXPECT_EQ(Pieces(SplitConfig("-", "MergedWithNext", false), "a-b--c"),
            (V{"a", "-b", "-", "-c"}));
  EXPECT_EQ(Pieces(SplitConfig("-", "Contiguous", false), "a-b--c"), (V{"a", "-", "b", "--", "c"}));
  // invert: the pattern describes the pieces to keep.
  EXPECT_EQ(Pieces(SplitConfig("[a-z]+", "Removed", true), "ab, cd!"), (V{"ab", "cd"}));
  EXPECT_EQ(Pieces(SplitConfig("x", "Isolated", false), ""), V{});
}

TEST(SplitTest, LiteralPatternAndDigits) {
  nlohmann::json literal = {{"type", "Split"}, {"pattern", {{"String", "."}}},
                            {"behavior", "Isolated"}, {"invert", false}};
  EXPECT_EQ(Pieces(literal, "a.b"), (V{"a", ".", "b"}));
  EXPECT_EQ(Pieces({{"type", "Digits"}, {"individual_digits", false}}, "ab123c4"),
            (V{"ab", "123", "c", "4"}));
  EXPECT_EQ(Pieces({{"type", "Digits"}, {"individual_digits", true}}, "a12٣"),
            (V{"a", "1", "2", "٣"}));
}

TEST(SplitTest, QwenPatternOnOnigurumaSemantics) {
  const std::string qwen =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  auto cfg = SplitConfig(qwen, "Isolated", false);
  EXPECT_EQ(Pieces(cfg, "Hello  world's 42!\n\n x"),
            (V{"Hello", " ", " world", "'s", " ", "4", "2", "!\n\n", " x"}));
  EXPECT_EQ(Pieces(cfg, "THEY'RE"), (V{"THEY", "'RE"}));
  // U+0085 and U+3000 are whitespace for Oniguruma's \s.
  EXPECT_EQ(Pieces(cfg, "a\u3000\u3000b"), (V{"a", "\u3000", "\u3000b"}));
  EXPECT_EQ(Pieces(cfg, "a\u0085"), (V{"a", "\u0085"}));
}

TEST(SplitTest, ByteLevelPrefixSpaceAndGpt2Regex) {
  nlohmann::json bl = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  EXPECT_EQ(Pieces(bl, "hi there"), (V{" hi", " there"}));
  auto pre = PreTokenizer::FromJson(bl);
  EXPECT_TRUE((*pre)->maps_bytes_at_end());
  // A step after ByteLevel sees the mapped characters (space is Ġ).
  nlohmann::json seq = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}},
                          SplitConfig("Ġ", "MergedWithNext", false)}}};
  EXPECT_EQ(Pieces(seq, "a b"), (V{"a", "Ġb"}));
}

TEST(RegexTest, EmptyMatchesAdvanceOneCharacter) {
  auto re = Regex::Compile("x*");
  ASSERT_TRUE(re.ok());
  std::vector<Regex::Match> m;
  ASSERT_TRUE((*re)->FindAll("éxx", &m).ok());
  ASSERT_EQ(m.size(), 3u);  // empty at 0, "xx" at 2, empty at the end
  EXPECT_EQ(m[0].begin, 0u);
  EXPECT_EQ(m[0].end, 0u);
  EXPECT_EQ(m[1].begin, 2u);
  EXPECT_EQ(m[1].end, 4u);
}

TEST(RegexTest, TranslatesOnigurumaEscapes) {
  EXPECT_EQ(TranslateOnigPattern(R"(a\hb)"), "a[0-9a-fA-F]b");
  EXPECT_EQ(TranslateOnigPattern(R"([\d\h])"), "[\\d0-9a-fA-F]");
  EXPECT_EQ(TranslateOnigPattern(R"(\\s)"), "\\\\s");  // an escaped backslash, then 's'
  EXPECT_EQ(TranslateOnigPattern(R"([]\s])").substr(0, 4), "[]\\t");
}

TEST(Utf8Test, FindInvalidAndLossy) {
  EXPECT_EQ(utf8::FindInvalid("héllo"), 6u);
  EXPECT_EQ(utf8::FindInvalid("ab\xC0\x80"), 2u);       // overlong
  EXPECT_EQ(utf8::FindInvalid("abcdefghij\x80"), 10u);  // past the 8-byte fast path
  EXPECT_EQ(utf8::FindInvalid("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  std::string out;
  // Rust's from_utf8_lossy: E0 80 is two invalid subparts; F0 9F 98 is one.
  EXPECT_EQ(utf8::AppendLossy("a\xE0\x80z\xF0\x9F\x98", true, &out), 7u);
  EXPECT_EQ(out, "a\uFFFD\uFFFDz\uFFFD");
  out.clear();
  EXPECT_EQ(utf8::AppendLossy("a\xF0\x9F\x98", false, &out), 1u);  // held back
  EXPECT_EQ(out, "a");
  const auto& alphabet = utf8::GetByteLevelAlphabet();
  EXPECT_EQ(alphabet.byte_to_utf8[' '], "Ġ");
  EXPECT_EQ(alphabet.byte_to_utf8['\n'], "Ċ");
  EXPECT_EQ(alphabet.byte_to_utf8['a'], "a");
  for (int b = 0; b < 256; ++b) EXPECT_EQ(alphabet.char_to_byte[alphabet.byte_to_char[b]], b);
}

}  // namespace
}  // namespace corolla
