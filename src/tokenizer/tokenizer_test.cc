// Exactness against Hugging Face: the golden cases of tests/data/tokenizer-golden (encoded and
// decoded by the `tokenizers` library) and the demo model's golden chats.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer_test_util.h"

namespace corolla {
namespace {

using testing::LoadRealTokenizer;
using testing::ReadJsonFile;

std::string Shorten(const std::string& text) {
  return text.size() <= 60 ? text : text.substr(0, 60) + "...";
}

std::string StreamAll(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  StreamingDetokenizer stream(tok, skip);
  std::string text;
  for (int32_t id : ids) {
    auto piece = stream.Push(id);
    EXPECT_TRUE(piece.ok()) << piece.status().ToString();
    if (piece.ok()) text += *piece;
  }
  return text + stream.Flush();
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, EncodeAndDecodeMatchHuggingFace) {
  auto tok = LoadRealTokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  auto golden = ReadJsonFile("tests/data/tokenizer-golden/" + GetParam() + ".json");
  ASSERT_TRUE(golden.contains("cases"));
  ASSERT_GE(golden["cases"].size(), 30u);
  for (const auto& c : golden["cases"]) {
    std::string text = c["text"];
    std::vector<int32_t> want = c["ids"];
    auto ids = tok->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(*ids, want) << "encoding \"" << Shorten(text) << "\"";
    auto decoded = tok->Decode(want);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(*decoded, c["decoded"].get<std::string>()) << "decoding \"" << Shorten(text) << "\"";
  }
}

TEST_P(GoldenTest, StreamingEqualsOneShot) {
  auto tok = LoadRealTokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  auto golden = ReadJsonFile("tests/data/tokenizer-golden/" + GetParam() + ".json");
  for (const auto& c : golden["cases"]) {
    std::vector<int32_t> ids = c["ids"];
    for (bool skip : {false, true}) {
      auto one_shot = tok->Decode(ids, skip);
      ASSERT_TRUE(one_shot.ok());
      EXPECT_EQ(StreamAll(*tok, ids, skip), *one_shot)
          << "\"" << Shorten(c["text"]) << "\" skip=" << skip;
    }
  }
  for (const auto& c : golden["chat"]) {
    std::vector<int32_t> ids = c["ids"];
    EXPECT_EQ(StreamAll(*tok, ids, false), *tok->Decode(ids, false));
    EXPECT_EQ(StreamAll(*tok, ids, true), *tok->Decode(ids, true));
  }
}

TEST_P(GoldenTest, StreamingHoldsBackIncompleteUtf8) {
  auto tok = LoadRealTokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  // An emoji is split over byte tokens by both vocabularies; no piece may end mid-character.
  auto ids = tok->Encode("a😀👍🏽🇧🇷b");
  ASSERT_TRUE(ids.ok());
  StreamingDetokenizer stream(*tok, false);
  std::string all;
  for (int32_t id : *ids) {
    auto piece = stream.Push(id);
    ASSERT_TRUE(piece.ok());
    EXPECT_EQ(piece->find("\xEF\xBF\xBD"), std::string::npos) << "replacement char emitted early";
    all += *piece;
  }
  EXPECT_EQ(stream.Flush(), "");
  EXPECT_EQ(all, "a😀👍🏽🇧🇷b");
}

TEST_P(GoldenTest, ChatTextsEncodeToGoldenIds) {
  auto tok = LoadRealTokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  auto golden = ReadJsonFile("tests/data/tokenizer-golden/" + GetParam() + ".json");
  ASSERT_TRUE(golden.contains("chat"));
  ASSERT_FALSE(golden["chat"].empty());
  for (const auto& c : golden["chat"]) {
    std::string text = c["text"];
    std::vector<int32_t> want = c["ids"];
    auto ids = tok->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(*ids, want) << "encoding chat \"" << Shorten(text) << "\"";
    EXPECT_EQ(*tok->Decode(want), text);
  }
}

// The whole prompt path: ChatTemplate renders each golden conversation, Encode tokenises it.
TEST_P(GoldenTest, RenderedChatsEncodeToGoldenIds) {
  auto tok = LoadRealTokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  auto chat_template = ChatTemplate::LoadFromDir(testing::RealTokenizerDir(GetParam()));
  ASSERT_TRUE(chat_template.ok()) << chat_template.status().ToString();
  auto golden = ReadJsonFile("tests/data/tokenizer-golden/" + GetParam() + ".json");
  for (const auto& c : golden["chat"]) {
    ChatRenderOptions options;
    options.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    auto text = chat_template->Render(nlohmann::ordered_json(c["messages"]), options);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    EXPECT_EQ(*text, c["text"].get<std::string>());
    auto ids = tok->Encode(*text);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>());
  }
}

INSTANTIATE_TEST_SUITE_P(Real, GoldenTest, ::testing::Values("qwen3", "deepseek_v3"));

TEST(GoldenTest, SpecialTokenIdsAndFlags) {
  auto qwen = LoadRealTokenizer("qwen3");
  ASSERT_NE(qwen, nullptr);
  EXPECT_EQ(qwen->TokenToId("<|im_start|>"), 151644);
  EXPECT_EQ(qwen->TokenToId("<think>"), 151667);
  EXPECT_TRUE(qwen->IsSpecial(151644));
  EXPECT_FALSE(qwen->IsSpecial(151667));  // <think> is added but not special
  EXPECT_FALSE(qwen->IsSpecial(872));
  EXPECT_EQ(qwen->eos_token_id(), 151645);
  EXPECT_FALSE(qwen->bos_token_id().has_value());
  EXPECT_EQ(qwen->vocab_size(), 151669);
  // skip_special_tokens drops <|im_start|> but keeps the non-special <think>.
  auto ids = qwen->Encode("<|im_start|><think>x</think><|im_end|>");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*qwen->Decode(*ids, true), "<think>x</think>");

  auto deepseek = LoadRealTokenizer("deepseek_v3");
  ASSERT_NE(deepseek, nullptr);
  EXPECT_EQ(deepseek->bos_token_id(), 0);
  EXPECT_EQ(deepseek->eos_token_id(), 1);
}

TEST(DemoModelTest, GoldenChatsEncodeAndDecode) {
  auto tok = Tokenizer::LoadFromDir("models/corolla-demo");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto golden = ReadJsonFile("models/corolla-demo/golden-chat.json");
  ASSERT_TRUE(golden.contains("chats"));
  ASSERT_FALSE(golden["chats"].empty());
  for (const auto& c : golden["chats"]) {
    std::string prompt = c["prompt_text"];
    std::vector<int32_t> prompt_ids = c["prompt_ids"];
    auto ids = (*tok)->Encode(prompt);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(*ids, prompt_ids) << Shorten(prompt);
    EXPECT_EQ(*(*tok)->Decode(prompt_ids), prompt);
    // greedy_text is the completion without its closing <|im_end|>: skip special tokens.
    std::vector<int32_t> greedy = c["greedy_ids"];
    auto text = (*tok)->Decode(greedy, /*skip_special_tokens=*/true);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, c["greedy_text"].get<std::string>());
    EXPECT_EQ(StreamAll(**tok, greedy, true), *text);
  }
}

}  // namespace
}  // namespace corolla
