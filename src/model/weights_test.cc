// WeightLoader's shards of block-scaled FP8 weights: a rank's rows or columns, cut anywhere
// (inside a 128 x 128 scale block, in the partial last block), dequantise every element with
// the scale of its block in the whole tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "base/numeric.h"
#include "model/weights.h"

namespace corolla {
namespace {

class Fp8Shard : public ::testing::Test {
 protected:
  // w [300, 260] F8_E4M3: 3 x 3 scale blocks of 128 x 128, the last row and column of blocks
  // partial (44 rows, 4 columns); a different power-of-two-free scale per block.
  static constexpr int64_t kRows = 300, kCols = 260;
  void SetUp() override {
    std::mt19937 rng(7);
    for (int64_t i = 0; i < w_.numel(); ++i) {
      uint8_t b;
      do b = static_cast<uint8_t>(rng()); while ((b & 0x7f) == 0x7f);  // no NaNs
      w_.ptr<uint8_t>()[i] = b;
    }
    for (int64_t i = 0; i < scale_.numel(); ++i) scale_.ptr<float>()[i] = 0.013f * static_cast<float>(i + 3);
    checkpoint_ = Checkpoint::FromViews("<fp8 shard test>", {{"w.weight", w_.view()}, {"w.weight_scale_inv", scale_.view()}});
  }
  float Reference(int64_t i, int64_t j) const {
    return ToFloat(fp8e4m3::FromBits(w_.ptr<uint8_t>()[i * kCols + j])) * scale_.ptr<float>()[(i / 128) * 3 + j / 128];
  }
  // Max |loaded - reference| over the shard, and whether the shape is the shard's.
  double MaxError(const Tensor& got, const Shard& shard) const {
    const int64_t r0 = shard.dim == 0 ? shard.begin : 0, r1 = shard.dim == 0 ? shard.end : kRows;
    const int64_t c0 = shard.dim == 1 ? shard.begin : 0, c1 = shard.dim == 1 ? shard.end : kCols;
    EXPECT_EQ(got.view().shape, (Shape{r1 - r0, c1 - c0}));
    if (got.view().shape != Shape{r1 - r0, c1 - c0}) return INFINITY;
    double err = 0;
    for (int64_t i = r0; i < r1; ++i)
      for (int64_t j = c0; j < c1; ++j)
        err = std::max(err, static_cast<double>(std::fabs(got.ptr<float>()[(i - r0) * (c1 - c0) + j - c0] - Reference(i, j))));
    return err;
  }

  Tensor w_ = Tensor::Empty(DType::kF8E4M3, {kRows, kCols});
  Tensor scale_ = Tensor::Empty(DType::kF32, {3, 3});
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<Backend> cpu_ = MakeCpuBackend();
};

TEST_F(Fp8Shard, RowsAndColumnsCutInsideBlocks) {
  const std::vector<Shard> shards = {
      {},                             // whole
      Shard::Rows(96, 200),           // starts inside block row 0, ends inside block row 1
      Shard::Part(0, kRows, 1, 3),    // rows [100, 200): --tp 3 of 300 rows
      Shard::Part(0, kRows, 2, 3),    // rows [200, 300): into the partial last block row
      Shard::Rows(127, 129),          // across one block edge
      Shard::Cols(64, 250),           // columns across blocks 0, 1 and the partial block 2
      Shard::Part(1, kCols, 1, 4),    // columns [65, 130): --tp 4 of 260
      Shard::Part(1, kCols, 3, 4),    // columns [195, 260)
      Shard::Cols(259, 260),          // the last column alone
  };
  for (const Shard& shard : shards) {
    WeightLoader loader(*checkpoint_, *cpu_);
    auto host = loader.LoadHost("w.weight", {kRows, kCols}, shard);
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    EXPECT_EQ(MaxError(*host, shard), 0.0) << "LoadHost, shard dim " << shard.dim << " [" << shard.begin << ", " << shard.end << ")";
    auto loaded = loader.Load("w.weight", {kRows, kCols}, shard);  // the CPU backend holds f32
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    EXPECT_EQ(MaxError(*loaded, shard), 0.0) << "Load, shard dim " << shard.dim << " [" << shard.begin << ", " << shard.end << ")";
    EXPECT_TRUE(loader.CheckAllUsed([](const std::string&) { return false; }).ok()) << "the scales count as used";
  }
}

TEST_F(Fp8Shard, ConcatenatesShardsOfSeveralTensors) {
  // Rows [96, 192) of w twice (as gate|up of one rank): each part keeps its own blocks' scales.
  WeightLoader loader(*checkpoint_, *cpu_);
  const Shard rows = Shard::Rows(96, 192);
  auto t = loader.LoadConcat({"w.weight", "w.weight"}, {{kRows, kCols}, {kRows, kCols}}, {rows, rows});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->view().shape, (Shape{192, kCols}));
  double err = 0;
  for (int64_t i = 0; i < 192; ++i)
    for (int64_t j = 0; j < kCols; ++j)
      err = std::max(err, static_cast<double>(std::fabs(t->ptr<float>()[i * kCols + j] - Reference(96 + i % 96, j))));
  EXPECT_EQ(err, 0.0);
}

TEST_F(Fp8Shard, AShardOutsideTheTensorNamesIt) {
  WeightLoader loader(*checkpoint_, *cpu_);
  auto t = loader.Load("w.weight", {kRows, kCols}, Shard::Cols(200, 261));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("tensor w.weight: shard [200, 261) of dim 1"), std::string::npos)
      << t.status().ToString();
}

// ||a - b|| / ||b|| of two host f32 tensors of one shape.
double NormError(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double d = static_cast<double>(a.ptr<float>()[i]) - b.ptr<float>()[i];
    num += d * d;
    den += static_cast<double>(b.ptr<float>()[i]) * b.ptr<float>()[i];
  }
  return std::sqrt(num / den);
}

// RunLinear of `w` against the dense Linear of the dequantised shard, on x [5, K] in [-1, 1].
double LinearError(Backend& cpu, const LinearWeight& w, const Tensor& dense) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  Tensor x = Tensor::Empty(DType::kF32, {5, w.cols});
  for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = d(rng);
  Tensor got = Tensor::Empty(DType::kF32, {5, w.rows}), want = Tensor::Empty(DType::kF32, {5, w.rows});
  RunLinear(cpu, x, w, got);
  cpu.Linear(x, dense, want);
  return NormError(got, want);
}

// Native FP8: shards on block boundaries stay FP8 (the activations quantised per 1 x 128 group
// cost a few percent), shards that cut a block are dequantised and say so.
TEST_F(Fp8Shard, LoadLinearKeepsBlockAlignedShardsFp8) {
  struct Case {
    Shard shard;
    bool fp8;
  };
  for (const Case& c : {Case{{}, true}, Case{Shard::Rows(128, 300), true}, Case{Shard::Cols(128, 260), true},
                        Case{Shard::Rows(96, 200), false}, Case{Shard::Part(1, kCols, 1, 4), false}}) {
    WeightLoader loader(*checkpoint_, *cpu_);
    loader.set_native_fp8(true);
    auto w = loader.LoadLinear("w.weight", {kRows, kCols}, c.shard);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const std::string name = "shard dim " + std::to_string(c.shard.dim) + " [" + std::to_string(c.shard.begin) +
                             ", " + std::to_string(c.shard.end) + ")";
    EXPECT_EQ(w->is_fp8(), c.fp8) << name;
    EXPECT_EQ(loader.dequantised_fp8().size(), c.fp8 ? 0u : 1u) << name;
    EXPECT_TRUE(loader.CheckAllUsed([](const std::string&) { return false; }).ok()) << name;
    Tensor dense = loader.LoadHost("w.weight", {kRows, kCols}, c.shard).value();
    ASSERT_EQ(w->rows, dense.dim(0));
    ASSERT_EQ(w->cols, dense.dim(1));
    const double err = LinearError(*cpu_, *w, dense);
    if (c.fp8) {
      EXPECT_GT(err, 0.0) << name << ": the activations were not quantised";
      EXPECT_LT(err, 0.1) << name;
    } else {
      EXPECT_EQ(err, 0.0) << name;
    }
  }
}

// Fused projections: parts join one FP8 upload while the rows before them fill whole blocks.
TEST_F(Fp8Shard, LoadLinearConcatSplitsAtPartialBlocks) {
  struct Case {
    Shard shard;
    size_t parts;
  };
  for (const Case& c : {Case{Shard::Rows(0, 128), 1}, Case{Shard::Rows(128, 300), 2}, Case{{}, 2}}) {
    WeightLoader loader(*checkpoint_, *cpu_);
    loader.set_native_fp8(true);
    auto w = loader.LoadLinearConcat({"w.weight", "w.weight"}, {{kRows, kCols}, {kRows, kCols}}, {c.shard, c.shard});
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_EQ(w->fp8.size(), c.parts);
    Tensor dense = loader.LoadConcat({"w.weight", "w.weight"}, {{kRows, kCols}, {kRows, kCols}}, {c.shard, c.shard})
                       .value();
    ASSERT_EQ(w->rows, dense.dim(0));
    EXPECT_EQ(w->fp8.back().first_row, c.parts == 1 ? 0 : dense.dim(0) / 2);
    const double err = LinearError(*cpu_, *w, dense);
    EXPECT_GT(err, 0.0);
    EXPECT_LT(err, 0.1);
  }
}

// Without native FP8 (the CPU default) LoadLinear is Load.
TEST_F(Fp8Shard, LoadLinearDequantisesWhenNativeIsOff) {
  WeightLoader loader(*checkpoint_, *cpu_);
  auto w = loader.LoadLinear("w.weight", {kRows, kCols});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_FALSE(w->is_fp8());
  EXPECT_TRUE(loader.dequantised_fp8().empty());
  EXPECT_EQ(MaxError(w->dense, {}), 0.0);
}

// Routed experts kept FP8 (LoadExpertsFp8): per-expert e4m3 gate/up/down with their own scale
// blocks (I 192: a partial block in each half), an expert-parallel range of 2 of 4 experts;
// Backend::MoeExpertsFp8 on them equals MoeExperts on the dequantised load.
TEST(Fp8Experts, LoadExpertsFp8KeepsTheRankExpertsFp8) {
  constexpr int64_t kExperts = 4, kInter = 192, kHidden = 256, kIb = 2, kHb = 2;
  std::mt19937 rng(3);
  std::vector<Tensor> tensors;
  std::vector<std::pair<std::string, TensorView>> views;
  auto add = [&](const std::string& name, int64_t rows, int64_t cols) {
    Tensor w = Tensor::Empty(DType::kF8E4M3, {rows, cols});
    for (int64_t i = 0; i < w.numel(); ++i) w.ptr<uint8_t>()[i] = ToFp8e4m3(std::uniform_real_distribution<float>(-4, 4)(rng)).bits;
    Tensor s = Tensor::Empty(DType::kF32, {(rows + 127) / 128, (cols + 127) / 128});
    for (int64_t i = 0; i < s.numel(); ++i) s.ptr<float>()[i] = std::uniform_real_distribution<float>(0.01f, 0.02f)(rng);
    views.push_back({name, w.view()});
    views.push_back({name + "_scale_inv", s.view()});
    tensors.push_back(w);
    tensors.push_back(s);
  };
  for (int e = 0; e < kExperts; ++e) {
    const std::string p = "experts." + std::to_string(e) + ".";
    add(p + "gate_proj.weight", kInter, kHidden);
    add(p + "up_proj.weight", kInter, kHidden);
    add(p + "down_proj.weight", kHidden, kInter);
  }
  auto checkpoint = Checkpoint::FromViews("<fp8 experts test>", views);
  auto cpu = MakeCpuBackend();
  {
    WeightLoader off(*checkpoint, *cpu);  // native FP8 off: nothing loaded
    ExpertsFp8 none;
    auto r = off.LoadExpertsFp8("experts.", kExperts, kInter, kHidden, 1, 2, &none);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(*r);
    EXPECT_FALSE(none.loaded());
  }
  WeightLoader loader(*checkpoint, *cpu);
  loader.set_native_fp8(true);
  ExpertsFp8 fp8;
  auto r = loader.LoadExpertsFp8("experts.", kExperts, kInter, kHidden, 1, 2, &fp8);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(*r);
  EXPECT_TRUE(loader.CheckAllUsed([](const std::string&) { return false; }).ok());
  EXPECT_EQ(loader.num_native_fp8(), 6);
  EXPECT_EQ(fp8.gate_up.view().shape, (Shape{2, 2 * kInter, kHidden}));
  EXPECT_EQ(fp8.gate_up_scale.view().shape, (Shape{2, 2 * kIb, kHb}));
  EXPECT_EQ(fp8.down.view().shape, (Shape{2, kHidden, kInter}));
  EXPECT_EQ(fp8.down_scale.view().shape, (Shape{2, kHb, kIb}));
  // Expert 2 (local 1): its up rows and up scales follow its gate's.
  const TensorView up = checkpoint->Get("experts.2.up_proj.weight").value();
  const TensorView up_scale = checkpoint->Get("experts.2.up_proj.weight_scale_inv").value();
  EXPECT_EQ(std::memcmp(fp8.gate_up.ptr<uint8_t>() + (2 * kInter + kInter) * kHidden, up.data, kInter * kHidden), 0);
  EXPECT_EQ(fp8.gate_up_scale.ptr<float>()[(2 * kIb + kIb) * kHb + 1], up_scale.ptr<float>()[1]);

  WeightLoader dense_loader(*checkpoint, *cpu);
  Tensor gate_up = dense_loader.LoadExpertsGateUp("experts.", kExperts, kInter, kHidden, 1, 2).value();
  Tensor down = dense_loader.LoadExpertsDown("experts.", kExperts, kInter, kHidden, 1, 2).value();
  const int64_t tokens = 5, k = 2;
  Tensor x = Tensor::Empty(DType::kF32, {tokens, kHidden});
  for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = std::uniform_real_distribution<float>(-1, 1)(rng);
  Tensor ids = Tensor::Empty(DType::kI32, {tokens, k}), weights = Tensor::Empty(DType::kF32, {tokens, k});
  const int32_t id_list[] = {0, 1, 1, -1, 0, 0, 1, 0, 2, 1};
  for (int64_t i = 0; i < tokens * k; ++i) ids.ptr<int32_t>()[i] = id_list[i], weights.ptr<float>()[i] = 0.5f;
  Tensor want = Tensor::Empty(DType::kF32, {tokens, kHidden}), got = Tensor::Empty(DType::kF32, {tokens, kHidden});
  cpu->MoeExperts(x, ids, weights, gate_up, down, want);
  ASSERT_TRUE(cpu->supports_moe_fp8(kHidden, kInter));
  cpu->MoeExpertsFp8(x, ids, weights, fp8.gate_up, fp8.gate_up_scale, fp8.down, fp8.down_scale, got);
  double err = 0, scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(got.ptr<float>()[i] - want.ptr<float>()[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(want.ptr<float>()[i])));
  }
  EXPECT_GT(scale, 0.01);
  EXPECT_LT(err / scale, 1e-5);
}

}  // namespace
}  // namespace corolla
