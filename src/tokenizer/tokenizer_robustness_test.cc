// Round trips over a generated multilingual corpus, bad input, and a bounded-time fuzz of the
// tokenizer.json loader.
#include <atomic>
#include <chrono>
#include <thread>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_test_util.h"
#include "tokenizer/utf8.h"

namespace corolla {
namespace {

using nlohmann::json;
using testing::LoadRealTokenizer;

std::string Nfc(const std::string& s) {
  utf8proc_uint8_t* out = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(s.c_str()));
  std::string r(reinterpret_cast<char*>(out));
  std::free(out);
  return r;
}

// Seeded random text across scripts: Latin with accents and combining marks, CJK, Arabic,
// Devanagari, emoji with ZWJ sequences, flags and skin tones, digits, punctuation, whitespace
// runs with \r\n and tabs.
std::string RandomText(std::mt19937* rng, int num_items) {
  auto pick = [&](int n) { return static_cast<int>((*rng)() % n); };
  auto range = [&](char32_t lo, char32_t hi) { return lo + char32_t((*rng)() % (hi - lo + 1)); };
  std::string s;
  for (int i = 0; i < num_items; ++i) {
    int kind = pick(14);
    int len = 1 + pick(8);
    for (int j = 0; j < len; ++j) {
      switch (kind) {
        case 0: utf8::Append(range('a', 'z'), &s); break;
        case 1: utf8::Append(range('A', 'Z'), &s); break;
        case 2: utf8::Append(range(0xC0, 0x17F), &s); break;  // Latin-1 + Extended-A
        case 3:  // base letter + combining marks
          utf8::Append(range('a', 'z'), &s);
          for (int k = pick(3); k > 0; --k) utf8::Append(range(0x300, 0x36F), &s);
          break;
        case 4: utf8::Append(range(0x4E00, 0x9FFF), &s); break;
        case 5: utf8::Append(range(0x3040, 0x30FF), &s); break;
        case 6: utf8::Append(range(0x621, 0x64A), &s); break;
        case 7:  // Devanagari consonant + vowel sign / virama
          utf8::Append(range(0x915, 0x939), &s);
          if (pick(2)) utf8::Append(range(0x93E, 0x94D), &s);
          break;
        case 8: {  // emoji, with skin tone, ZWJ family, or flag
          int e = pick(4);
          if (e == 0) utf8::Append(range(0x1F600, 0x1F64F), &s);
          if (e == 1) {
            utf8::Append(range(0x1F466, 0x1F469), &s);
            utf8::Append(range(0x1F3FB, 0x1F3FF), &s);
          }
          if (e == 2) s += "👨\u200D👩\u200D👧\u200D👦";
          if (e == 3) {
            utf8::Append(range(0x1F1E6, 0x1F1FF), &s);
            utf8::Append(range(0x1F1E6, 0x1F1FF), &s);
          }
          break;
        }
        case 9: utf8::Append(range('0', '9'), &s); break;
        case 10: s += " \t\n\r "[pick(5)]; break;
        case 11: s += (pick(2) ? "\r\n" : "   "); break;
        case 12: s += "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"[pick(32)]; break;
        case 13: utf8::Append(range(0x400, 0x4FF), &s); break;
      }
    }
    if (pick(3) == 0) s += ' ';
  }
  return s;
}

class RealTokenizerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RealTokenizerTest, RoundTripIsNfcOfInput) {
  auto tok = LoadRealTokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  bool nfc = GetParam() == "qwen3";  // deepseek_v3 has an empty normalizer
  std::mt19937 rng(1234);
  for (int i = 0; i < 300; ++i) {
    std::string text = RandomText(&rng, 1 + i % 40);
    auto ids = tok->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    auto back = tok->Decode(*ids);
    ASSERT_TRUE(back.ok());
    ASSERT_EQ(*back, nfc ? Nfc(text) : text) << "case " << i;
  }
}

TEST_P(RealTokenizerTest, ConcurrentEncodeAgreesWithSerial) {
  auto tok = LoadRealTokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(99);
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < 64; ++i) {
    texts.push_back(RandomText(&rng, 30));
    want.push_back(*tok->Encode(texts.back()));
  }
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round)
        for (size_t i = 0; i < texts.size(); ++i) {
          size_t k = (i + t * 7) % texts.size();
          if (*tok->Encode(texts[k]) != want[k]) ++mismatches;
        }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_P(RealTokenizerTest, RejectsBadInput) {
  auto tok = LoadRealTokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  auto bad = tok->Encode("abc\xFFxyz");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("offset 3"), std::string::npos) << bad.status().ToString();
  auto truncated = tok->Encode("ok \xE4\xB8");
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("offset 3"), std::string::npos);
  auto surrogate = tok->Encode("\xED\xA0\x80");
  EXPECT_FALSE(surrogate.ok());

  std::vector<int32_t> ids = {1, tok->vocab_size()};
  auto out = tok->Decode(ids);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(out.status().message().find(std::to_string(tok->vocab_size())), std::string::npos);
  std::vector<int32_t> negative = {-5};
  EXPECT_EQ(tok->Decode(negative).status().code(), StatusCode::kOutOfRange);
  StreamingDetokenizer stream(*tok, false);
  EXPECT_EQ(stream.Push(-1).status().code(), StatusCode::kOutOfRange);
}

TEST_P(RealTokenizerTest, LongRunsStayFastAndRoundTrip) {
  auto tok = LoadRealTokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  // One 200 KB letter run (a single pre-token), a 100 KB whitespace run before a word, and
  // 100 KB of one CJK character: each must be near-linear, not quadratic.
  std::string text = std::string(200000, 'a') + std::string(100000, ' ') + "x\n";
  for (int i = 0; i < 33000; ++i) text += "一";
  auto start = std::chrono::steady_clock::now();
  auto ids = tok->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(*tok->Decode(*ids), text);
}

INSTANTIATE_TEST_SUITE_P(Real, RealTokenizerTest, ::testing::Values("qwen3", "deepseek_v3"));

// A small byte-level BPE tokenizer.json: the 256 byte characters plus a few merges.
json SmallTokenizerJson() {
  const auto& alphabet = utf8::GetByteLevelAlphabet();
  json vocab = json::object();
  int next = 0;
  for (int b = 0; b < 256; ++b) vocab[alphabet.byte_to_utf8[b]] = next++;
  json merges = json::array();
  for (const char* m : {"h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "r l", "Ġwo rl", "Ġworl d", "1 2"}) {
    std::string s = m;
    size_t sp = s.find(' ');
    merges.push_back(s);
    vocab[s.substr(0, sp) + s.substr(sp + 1)] = next++;
  }
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = json::array(
      {{{"id", next}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
       {{"id", next + 1}, {"content", "<pad>"}, {"special", true}, {"normalized", false},
        {"lstrip", true}, {"rstrip", true}}});
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}})}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Digits"}, {"individual_digits", true}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}})}};
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {next}}, {"tokens", {"<s>"}}}}}}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"dropout", nullptr}};
  return j;
}

TEST(SmallTokenizerTest, MergesDigitsAddedTokensAndPostProcessor) {
  auto tok = Tokenizer::LoadFromJson(SmallTokenizerJson().dump());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  int32_t hello = *(*tok)->TokenToId("hello"), world = *(*tok)->TokenToId("Ġworld");
  int32_t bos = *(*tok)->TokenToId("<s>"), pad = *(*tok)->TokenToId("<pad>");
  EXPECT_EQ(*(*tok)->Encode("hello world"), (std::vector<int32_t>{hello, world}));
  EXPECT_EQ(*(*tok)->Encode("hello world", true), (std::vector<int32_t>{bos, hello, world}));
  // Digits are split one by one, so the merge "1 2" never applies.
  EXPECT_EQ(*(*tok)->Encode("12"), (std::vector<int32_t>{'1', '2'}));
  // <pad> strips the spaces around it; <s> does not.
  EXPECT_EQ(*(*tok)->Encode("hello  <pad>  hello"), (std::vector<int32_t>{hello, pad, hello}));
  auto ids = *(*tok)->Encode("hello <s>");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids.back(), bos);
  EXPECT_EQ(*(*tok)->Decode(ids), "hello <s>");
  EXPECT_EQ(*(*tok)->Decode(ids, true), "hello ");
  // NFC: e + combining acute becomes é before byte-level BPE.
  EXPECT_EQ(*(*tok)->Decode(*(*tok)->Encode("e\u0301")), "\u00E9");
  // Lone byte tokens of a split character decode to U+FFFD, as from_utf8_lossy does.
  std::vector<int32_t> partial = {*(*tok)->TokenToId("ä")};  // byte 0xE4
  EXPECT_EQ(*(*tok)->Decode(partial), "\xEF\xBF\xBD");
}

TEST(SmallTokenizerTest, LoaderErrorsNameTheProblem) {
  auto malformed = Tokenizer::LoadFromJson("{\"model\": {\"type\": \"BPE\", ");
  ASSERT_FALSE(malformed.ok());
  EXPECT_EQ(malformed.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(malformed.status().message().find("parse"), std::string::npos);

  json j = SmallTokenizerJson();
  j["model"]["type"] = "Unigram";
  auto unigram = Tokenizer::LoadFromJson(j.dump());
  ASSERT_FALSE(unigram.ok());
  EXPECT_EQ(unigram.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(unigram.status().message().find("Unigram"), std::string::npos);

  j = SmallTokenizerJson();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  auto bert = Tokenizer::LoadFromJson(j.dump());
  ASSERT_FALSE(bert.ok());
  EXPECT_NE(bert.status().message().find("BertNormalizer"), std::string::npos);

  j = SmallTokenizerJson();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_EQ(Tokenizer::LoadFromJson(j.dump()).status().code(), StatusCode::kUnsupported);

  j = SmallTokenizerJson();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_EQ(Tokenizer::LoadFromJson(j.dump()).status().code(), StatusCode::kUnsupported);

  j = SmallTokenizerJson();
  j["model"]["merges"].push_back("zz qq");
  auto bad_merge = Tokenizer::LoadFromJson(j.dump());
  ASSERT_FALSE(bad_merge.ok());
  EXPECT_NE(bad_merge.status().message().find("zz"), std::string::npos);

  j = SmallTokenizerJson();
  j["model"]["vocab"] = "not an object";
  EXPECT_EQ(Tokenizer::LoadFromJson(j.dump()).status().code(), StatusCode::kCorrupt);

  j = SmallTokenizerJson();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}},
                        {"behavior", "Isolated"}};
  auto bad_regex = Tokenizer::LoadFromJson(j.dump());
  ASSERT_FALSE(bad_regex.ok());
  EXPECT_NE(bad_regex.status().message().find("(unclosed"), std::string::npos);

  auto missing = Tokenizer::LoadFromDir("/nonexistent/tokenizer/dir");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// Mutates a small valid tokenizer.json (byte flips, truncations, deletions, duplications) for
// about two seconds; loading and using the result must never crash.
TEST(SmallTokenizerTest, FuzzLoaderForTwoSeconds) {
  const std::string base = SmallTokenizerJson().dump();
  std::mt19937 rng(20240601);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int num_loaded = 0, num_runs = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    std::string s = base;
    for (int k = 1 + rng() % 4; k > 0 && !s.empty(); --k) {
      size_t pos = rng() % s.size();
      switch (rng() % 5) {
        case 0: s[pos] = static_cast<char>(rng()); break;
        case 1: s[pos] ^= static_cast<char>(1 << (rng() % 8)); break;
        case 2: s.resize(pos); break;
        case 3: s.erase(pos, 1 + rng() % 16); break;
        case 4: s.insert(pos, s.substr(rng() % s.size(), 1 + rng() % 16)); break;
      }
    }
    ++num_runs;
    auto tok = Tokenizer::LoadFromJson(s);
    if (!tok.ok()) continue;
    ++num_loaded;
    auto ids = (*tok)->Encode("hello world 123 <s> <pad> é");
    if (ids.ok()) (void)(*tok)->Decode(*ids);
    std::vector<int32_t> some = {0, 1, (*tok)->vocab_size() - 1};
    (void)(*tok)->Decode(some);
  }
  EXPECT_GT(num_runs, 100);
  EXPECT_GT(num_loaded, 0);  // some mutations (e.g. inside strings) still load
}

}  // namespace
}  // namespace corolla
