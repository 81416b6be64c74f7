// End-to-end tests of the `corolla` binary: the logits command against the reference goldens,
// generate on the demo model, and a clear error with a non-zero exit for every bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include "model/safetensors.h"

namespace corolla {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int exit_code;
  std::string output;  // stdout and stderr
};

RunResult RunCorolla(const std::string& args) {
  std::string cmd = std::string(COROLLA_BINARY) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

std::string TempPath(const std::string& name) {
  return (fs::temp_directory_path() / ("corolla_cli_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::string IdsOf(const TensorView& v) {
  std::string s;
  for (int64_t i = 0; i < v.numel(); ++i) s += (i ? "," : "") + std::to_string(v.ptr<int32_t>()[i]);
  return s;
}

TEST(Cli, HelpExplainsEveryCommand) {
  RunResult r = RunCorolla("--help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* cmd : {"generate", "logits", "tokenize", "detokenize"}) {
    EXPECT_NE(r.output.find(cmd), std::string::npos) << cmd;
    RunResult h = RunCorolla(std::string(cmd) + " --help");
    EXPECT_EQ(h.exit_code, 0) << cmd;
    EXPECT_NE(h.output.find("usage: corolla " + std::string(cmd)), std::string::npos) << h.output;
  }
  RunResult g = RunCorolla("generate --help");
  for (const char* opt : {"--model", "--prompt-ids", "--max-tokens", "--temperature", "--top-p", "--top-k",
                          "--min-p", "--seed", "--json"})
    EXPECT_NE(g.output.find(opt), std::string::npos) << opt;
}

TEST(Cli, LogitsMatchTheGoldens) {
  for (std::string name : {"qwen3-dense", "qwen3-moe"}) {
    auto golden = SafetensorsFile::Open("tests/data/golden/" + name + ".safetensors").value();
    for (int k : {1, 4}) {
      TensorView ids = golden->View(*golden->Find("ids_" + std::to_string(k)));
      TensorView ref = golden->View(*golden->Find("logits_" + std::to_string(k)));
      std::string out = TempPath(name + std::to_string(k) + ".safetensors");
      RunResult r = RunCorolla("logits --model tests/data/models/" + name + " --ids " + IdsOf(ids) + " --out " + out);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      auto file = SafetensorsFile::Open(out);
      ASSERT_TRUE(file.ok()) << file.status().ToString();
      const SafetensorsEntry* e = (*file)->Find("logits");
      ASSERT_NE(e, nullptr);
      EXPECT_EQ(e->dtype, DType::kF32);
      ASSERT_EQ(e->shape, ref.shape);
      TensorView got = (*file)->View(*e);
      for (int64_t p = 0; p < ref.dim(0); ++p) {
        float err = 0, scale = 0;
        for (int64_t j = 0; j < ref.dim(1); ++j) {
          int64_t i = p * ref.dim(1) + j;
          err = std::max(err, std::fabs(got.ptr<float>()[i] - ref.ptr<float>()[i]));
          scale = std::max(scale, std::fabs(ref.ptr<float>()[i]));
        }
        EXPECT_LT(err, 1e-4f * scale) << name << " ids_" << k << " position " << p;
      }
      fs::remove(out);
    }
  }
}

TEST(Cli, GenerateOnTheBuiltInModel) {
  // The first golden chat of the demo model: "What is 7 + 5?" -> "7 + 5 = 12."
  RunResult r = RunCorolla("generate --prompt-ids 1,282,201,320,286,223,25,333,223,23,33,2,201,1,281,201 "
                    "--max-tokens 32 --temperature 0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"ids\":[25,333,223,23,317,223,19,20,16,2]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"finish_reason\":\"stop\""), std::string::npos) << r.output;
  RunResult plain = RunCorolla("generate --model models/corolla-demo --prompt-ids 1,282 --max-tokens 3 --ignore-eos --seed 7");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_NE(plain.output.find("finish_reason=length"), std::string::npos) << plain.output;
}

TEST(Cli, ChatAndTextPrompts) {
  RunResult r = RunCorolla("generate --chat 'What is the capital of Japan?' --temperature 0 --max-tokens 32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("The capital of Japan is Tokyo."), std::string::npos) << r.output;
  r = RunCorolla("generate --chat 'What is 7 + 5?' --temperature 0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"text\":\"7 + 5 = 12.\""), std::string::npos) << r.output;
  r = RunCorolla("generate --prompt 'The capital of' --max-tokens 4 --temperature 0");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// The model benchmarks run on the CPU too, for every family random weights cover.
TEST(Cli, BenchDecodeWithRandomWeightsOnTheCpu) {
  for (std::string name : {"qwen3-moe", "qwen3.5-moe-hybrid", "deepseek-v3"}) {
    RunResult r = RunCorolla("bench decode --config tests/data/models/" + name +
                             "/config.json --random-weights --device cpu --batch 1,3 --context 20 --steps 1");
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    EXPECT_NE(r.output.find("tokens/s"), std::string::npos) << name << "\n" << r.output;
  }
  // Truncated depth: the hybrid's first two layers are both linear attention.
  RunResult r = RunCorolla("bench decode --config tests/data/models/qwen3.5-moe-hybrid/config.json --random-weights "
                           "--device cpu --layers 2 --batch 2 --context 20 --steps 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("2 layers"), std::string::npos) << r.output;
  // Planned as the engine's decode graphs plan it: on the context bucket, the keys past the
  // context in empty splits.
  r = RunCorolla(
      "bench decode --config tests/data/models/qwen3-moe/config.json --random-weights --device cpu "
      "--batch 2 --context 300 --steps 1 --plan-bucket");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("context 300, cpu, planned on 512 keys"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokens/s"), std::string::npos) << r.output;
}

// --expert-load: one more step whose MoE layers' routing is summarised (3 layers of 16 experts,
// 4 a token: 83 tokens route 332 rows a layer).
TEST(Cli, BenchPrefillExpertLoad) {
  RunResult r = RunCorolla(
      "bench prefill --config tests/data/models/qwen3-moe/config.json --random-weights "
      "--device cpu --batch 2 --context 40 --decode-rows 3 --steps 1 --expert-load");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("expert load over 3 MoE layers"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("of 16 experts active"), std::string::npos) << r.output;
}

// A combination whose KV cache cannot fit the free memory (here 2 x 1e8 cached tokens, ~300 GB of
// host RAM) is skipped with the reason; the sweep goes on to the next one instead of aborting.
TEST(Cli, BenchSkipsABatchThatDoesNotFit) {
  RunResult r = RunCorolla("bench decode --config tests/data/models/qwen3-moe/config.json --random-weights "
                           "--device cpu --batch 2 --context 100000000,20 --steps 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("decode: batch 2, 100000000 tokens a sequence: skipped, its KV "
                                                     "cache \\([0-9.]+ GB\\) and activations need [0-9.]+ GB")))
      << r.output;
  EXPECT_NE(r.output.find("batch 2, context 20"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokens/s"), std::string::npos) << r.output;
}

// --tp: one process per rank, the experts split over them; rank 0 reports per-rank bytes.
TEST(Cli, BenchDecodeTensorParallelOnTheCpu) {
  RunResult r = RunCorolla("bench decode --config tests/data/models/qwen3-moe/config.json --random-weights "
                           "--device cpu --tp 2 --batch 2 --context 20 --steps 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tp 2 (experts over the same ranks)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokens/s"), std::string::npos) << r.output;
  // DP x TP: two replicas of two TP ranks, the experts over all four (each TP rank dispatches
  // one of its replica's two sequences).
  r = RunCorolla("bench decode --config tests/data/models/qwen3-moe/config.json --random-weights --device cpu "
                 "--tp 2 --dp 2 --ep 4 --batch 2 --context 20 --steps 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tp 2 (inside each DP replica)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dp 2 x ep 4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokens/s"), std::string::npos) << r.output;
}

// --breakdown: one row per op kind, whose calls add up over the layers (qwen3-moe: 3 layers,
// one MoeExperts each), for decode and prefill.
TEST(Cli, BenchBreakdownListsEachOpKind) {
  for (std::string mode : {"decode", "prefill"}) {
    RunResult r = RunCorolla("bench " + mode + " --config tests/data/models/qwen3-moe/config.json --random-weights "
                             "--device cpu --batch 2 --context 20 --steps 1 --breakdown");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("per-op breakdown (host clock)"), std::string::npos) << r.output;
    EXPECT_TRUE(std::regex_search(r.output, std::regex("\\n +MoeExperts +3 +[0-9.]+ +[0-9.]+%"))) << r.output;
    EXPECT_NE(r.output.find(" Attention D"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(" Linear "), std::string::npos) << r.output;
  }
}

// --decode-rows: a prefill step that also decodes sequences after their cached keys (a mixed
// step of chunked prefill); their tokens count in the step's, and bad values are errors.
TEST(Cli, BenchPrefillWithDecodeRows) {
  RunResult r = RunCorolla(
      "bench prefill --config tests/data/models/qwen3-moe/config.json --random-weights "
      "--device cpu --batch 2 --context 20 --decode-rows 3 --decode-context 30 --steps 1 "
      "--breakdown");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("2 x 20 tokens + 3 decode rows at context 30, cpu"), std::string::npos)
      << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("\\n +MoeExperts +3 +[0-9.]+ +[0-9.]+%")))
      << r.output;
  r = RunCorolla(
      "bench prefill --config tests/data/models/qwen3-moe/config.json --random-weights "
      "--device cpu --decode-rows -1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--decode-rows must be in [0, 65536]"), std::string::npos) << r.output;
}

// --marginal: the step once more without each op kind, one row each (qwen3-moe: 3 layers, one
// MoeExperts each); a declined DecodeMoeStack is not an op of the step.
TEST(Cli, BenchDecodeMarginalCostPerOpKind) {
  RunResult r = RunCorolla("bench decode --config tests/data/models/qwen3-moe/config.json --random-weights "
                           "--device cpu --batch 1 --context 20 --steps 1 --marginal");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("marginal cost of each op kind (the step without it, eager)"), std::string::npos)
      << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("\\n +MoeExperts +3 +[0-9.]+ +-?[0-9.]+ +-?[0-9.]+\\n")))
      << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("\\n +Attention [^\\n]* +3 +[0-9.]+ ")))
      << r.output;
  EXPECT_EQ(r.output.find("DecodeMoeStack"), std::string::npos) << r.output;
}

TEST(Cli, BadInputIsAClearErrorNotACrash) {
  const std::string dir = TempPath("empty_model");
  fs::create_directories(dir);
  struct Case {
    std::string args;
    std::string message;
  } cases[] = {
      {"generate --model " + dir + " --prompt-ids 1", "config.json: cannot open"},
      {"generate --model /nonexistent --prompt-ids 1", "does not exist"},
      {"generate --prompt-ids 1,99999", "token id 99999 at position 1 is outside the vocabulary"},
      {"generate --prompt-ids 1,x", "'x' is not a token id"},
      {"generate --prompt-ids 1 --max-tokens many", "--max-tokens expects an integer"},
      {"generate --prompt-ids 1 --bogus 3", "unknown option --bogus"},
      {"generate", "give exactly one of --prompt-ids, --prompt, --chat"},
      {"generate --prompt-ids 1 --chat hi", "give exactly one of"},
      {"generate --model tests/data/models/qwen3-moe --prompt hello", "need the model's tokenizer"},
      {"logits --model tests/data/models/qwen3-moe --ids 5000 --out /tmp/x.safetensors", "outside the vocabulary"},
      {"logits --ids 1 --out /nonexistent-dir/x.safetensors", "x.safetensors"},
      {"nonsense", "unknown command"},
  };
  for (const auto& c : cases) {
    RunResult r = RunCorolla(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_LT(r.exit_code, 128) << c.args << " crashed: " << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
  // More tokens than max_position_embeddings (2048 for the demo model).
  std::string ids = "1";
  for (int i = 0; i < 2048; ++i) ids += ",1";
  RunResult r = RunCorolla("logits --ids " + ids + " --out " + TempPath("long.safetensors"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("exceed the model's max_position_embeddings (2048)"), std::string::npos) << r.output;
  r = RunCorolla("generate --prompt-ids " + ids);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("the maximum context is 2048"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace corolla
