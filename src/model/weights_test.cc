// WeightLoader's shards of block-scaled FP8 weights: a rank's rows or columns, cut anywhere
// (inside a 128 x 128 scale block, in the partial last block), dequantise every element with
// the scale of its block in the whole tensor.
#include <gtest/gtest.h>

#include <cmath>
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

}  // namespace
}  // namespace corolla
