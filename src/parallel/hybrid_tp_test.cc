// Tensor parallelism of the Qwen3.5 / Qwen3-Next hybrids on the CPU, end to end through the
// launcher: `corolla logits --tp N` (Gated DeltaNet split by heads, gated attention by heads,
// shared expert column/row parallel, experts TP-EP) against one process, on the
// qwen3.5-moe-hybrid fixture (Hk 2, Hv 4) and the same weights in Qwen3-Next's fused layout;
// TP 4 replicates each key head on two ranks. Also chunked prefill and decoding (--chunk),
// the bf16 state, `generate --tp 2`, and the error for heads that do not split.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "model/qwen3_next_fixture.h"
#include "model/safetensors.h"
#include "parallel/run_corolla.h"

namespace corolla {
namespace {

namespace fs = std::filesystem;

// Logits of `ids` from `corolla logits` on `model` with `extra` arguments (empty on failure).
std::vector<float> Logits(const std::string& model, const std::string& ids,
                          const std::string& extra) {
  const std::string out =
      ::testing::TempDir() + "hybrid_tp_" + std::to_string(getpid()) + ".safetensors";
  auto [ok, output] = RunCorolla("logits --device cpu --threads 1 --model " + model + " --ids '" +
                                 ids + "' --out " + out + " " + extra);
  EXPECT_TRUE(ok) << extra << ": " << output;
  if (!ok) return {};
  auto file = SafetensorsFile::Open(out);
  EXPECT_TRUE(file.ok());
  if (!file.ok()) return {};
  TensorView v = (*file)->View(*(*file)->Find("logits"));
  std::vector<float> logits(v.ptr<float>(), v.ptr<float>() + v.numel());
  std::remove(out.c_str());
  return logits;
}

// The Qwen3-Next copy of the hybrid fixture, written once per test binary run and removed at exit.
const std::string& Qwen3NextDir() {
  struct TempModel {
    std::string dir;
    TempModel() {
      const fs::path d =
          fs::path(::testing::TempDir()) / ("hybrid_tp_qwen3_next_" + std::to_string(getpid()));
      fs::remove_all(d);
      fs::create_directories(d);
      Status s = WriteQwen3NextFixture("tests/data/models/qwen3.5-moe-hybrid", d.string());
      EXPECT_TRUE(s.ok()) << s.ToString();
      dir = d.string();
    }
    ~TempModel() { fs::remove_all(dir); }
  };
  static const TempModel model;
  return model.dir;
}

std::string ModelDir(const std::string& name) {
  return name == "qwen3-next" ? Qwen3NextDir() : "tests/data/models/" + name;
}

// fixture, --tp, extra arguments of both runs (--chunk, --linear-state-dtype), ids, bound on
// max |diff| / max |logit|.
using Case = std::tuple<std::string, int, std::string, std::string, double>;
class HybridTensorParallelCpu : public ::testing::TestWithParam<Case> {};

TEST_P(HybridTensorParallelCpu, LogitsEqualOneProcess) {
  const auto& [name, tp, extra, ids, bound] = GetParam();
  const std::string model = ModelDir(name);
  std::vector<float> single = Logits(model, ids, extra);
  std::vector<float> split = Logits(model, ids, extra + " --tp " + std::to_string(tp));
  ASSERT_FALSE(single.empty());
  ASSERT_EQ(single.size(), split.size());
  double err = 0, scale = 0;
  for (size_t i = 0; i < single.size(); ++i) {
    ASSERT_TRUE(std::isfinite(split[i])) << i;
    err = std::max(err, static_cast<double>(std::fabs(single[i] - split[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(single[i])));
  }
  std::printf("%s --tp %d %s: max |diff| %.2e of max|logit| %.2f (rel %.2e)\n", name.c_str(), tp,
              extra.c_str(), err, scale, err / scale);
  EXPECT_LT(err, bound * scale);
}

const char kIds17[] = "3,141,59,265,358,979,323,846,264,338,327,950,288,419,716,939,937";
const char kIds3Seqs[] =
    "3,141,59;265,358,979,323,846,264,338,327,950,288,419,716;939,937,1,2,3,4,5,6,7,8,9";

INSTANTIATE_TEST_SUITE_P(
    Fixtures, HybridTensorParallelCpu,
    ::testing::Values(Case{"qwen3.5-moe-hybrid", 2, "", kIds17, 1e-5},
                      Case{"qwen3.5-moe-hybrid", 4, "", kIds17, 1e-5},  // key heads replicated
                      Case{"qwen3-next", 2, "", kIds17, 1e-5},
                      Case{"qwen3-next", 4, "", kIds17, 1e-5},
                      // Chunked prefill: states carried over steps, three sequences in one batch.
                      Case{"qwen3.5-moe-hybrid", 2, "--chunk 4", kIds3Seqs, 1e-5},
                      Case{"qwen3-next", 4, "--chunk 1", kIds3Seqs, 1e-5},
                      // bf16 state: the ranks round the same values up to the f32 differences of
                      // the split sums, which may flip a rounding (measured: 7e-7, as f32).
                      Case{"qwen3.5-moe-hybrid", 2, "--chunk 1 --linear-state-dtype bf16", kIds17,
                           1e-4}));

TEST(HybridTensorParallelCpu, GenerateEqualsOneProcess) {
  // Two prompts, greedy, through the engine (decode steps, state slots, prefix-cache snapshots).
  const std::string args =
      "generate --device cpu --threads 1 --model tests/data/models/qwen3.5-moe-hybrid "
      "--prompt-ids '1,2,3;17,300,42,99,5' --max-tokens 8 --temperature 0 --ignore-eos";
  auto [ok1, one] = RunCorolla(args, /*with_stderr=*/false);
  auto [ok2, two] = RunCorolla(args + " --tp 2", /*with_stderr=*/false);
  ASSERT_TRUE(ok1 && ok2) << one << two;
  EXPECT_EQ(std::count(one.begin(), one.end(), '\n'), 2) << one;
  EXPECT_EQ(one, two);
}

TEST(HybridTensorParallelCpu, UnsplittableHeadsAreErrors) {
  // 4 linear value heads do not split over 3 ranks: every rank fails at load, naming them.
  auto [ok, out] = RunCorolla(
      "logits --device cpu --threads 1 --model tests/data/models/qwen3.5-moe-hybrid --ids 1,2 "
      "--out /dev/null --tp 3");
  EXPECT_FALSE(ok);
  EXPECT_NE(out.find("4 linear value heads"), std::string::npos) << out;
  auto [ok_dtype, out_dtype] = RunCorolla(
      "logits --device cpu --model tests/data/models/qwen3.5-moe-hybrid --ids 1,2 "
      "--out /dev/null --linear-state-dtype f16");
  EXPECT_FALSE(ok_dtype);
  EXPECT_NE(out_dtype.find("--linear-state-dtype f16"), std::string::npos) << out_dtype;
}

}  // namespace
}  // namespace corolla
