// The CPU twin of Backend::LinearFp8: the 1 x 128 activation quantisation (amax / 448 scales,
// the largest element at +-448) and the GEMM against a direct evaluation of the block-scaled sum
// (group sums times both scales), with partial blocks in N and K and padded scale rows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "base/numeric.h"
#include "kernels/cpu/ops.h"

namespace corolla {
namespace {

TEST(CpuLinearFp8, QuantisesEachGroupToItsAmax) {
  const int64_t rows = 3, k = 300, groups = 3;  // the last group has 44 columns
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  Tensor x = Tensor::Empty(DType::kF32, {rows, k});
  for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = d(rng);
  for (int64_t i = 0; i < k; ++i) x.ptr<float>()[2 * k + i] = 0.0f;  // an all-zero row
  std::vector<uint8_t> q(rows * k);
  std::vector<float> s(rows * groups);
  cpu::QuantizeFp8Groups(x, q.data(), s.data());
  for (int64_t t = 0; t < 2; ++t) {
    for (int64_t g = 0; g < groups; ++g) {
      float amax = 0;
      int64_t arg = 0;
      for (int64_t i = g * 128; i < std::min<int64_t>(k, g * 128 + 128); ++i)
        if (std::fabs(x.ptr<float>()[t * k + i]) > amax) amax = std::fabs(x.ptr<float>()[t * k + i]), arg = i;
      EXPECT_FLOAT_EQ(s[t * groups + g], amax / kFp8Max);
      EXPECT_EQ(q[t * k + arg] & 0x7f, 0x7e) << "the group's largest element is +-448";
    }
  }
  for (int64_t g = 0; g < groups; ++g) EXPECT_FLOAT_EQ(s[2 * groups + g], kFp8MinAmax / kFp8Max);
  for (int64_t i = 0; i < k; ++i) EXPECT_EQ(q[2 * k + i], 0);
}

TEST(CpuLinearFp8, EqualsTheBlockScaledSum) {
  const int64_t m = 4, n = 200, k = 300, nb = 2, kb = 3, ld = 4;
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> d(-1.f, 1.f), sd(0.01f, 0.1f);
  Tensor x = Tensor::Empty(DType::kF32, {m, k}), w = Tensor::Empty(DType::kF8E4M3, {n, k});
  Tensor scale = Tensor::Zeros(DType::kF32, {nb, ld});
  for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = d(rng);
  for (int64_t i = 0; i < w.numel(); ++i) w.ptr<uint8_t>()[i] = ToFp8e4m3(4.0f * d(rng)).bits;
  for (int64_t i = 0; i < nb; ++i)
    for (int64_t j = 0; j < kb; ++j) scale.ptr<float>()[i * ld + j] = sd(rng);
  TensorView sv = scale.view();
  sv.shape = Shape{nb, kb};
  Tensor out = Tensor::Empty(DType::kF32, {m, n});
  cpu::LinearFp8(x, w, sv, out);

  std::vector<uint8_t> q(m * k);
  std::vector<float> sx(m * kb);
  cpu::QuantizeFp8Groups(x, q.data(), sx.data());
  double err = 0, ref_max = 0;
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t r = 0; r < n; ++r) {
      double acc = 0;
      for (int64_t g = 0; g < kb; ++g) {
        double group = 0;
        for (int64_t i = g * 128; i < std::min<int64_t>(k, g * 128 + 128); ++i)
          group += double(ToFloat(fp8e4m3::FromBits(q[t * k + i]))) * ToFloat(fp8e4m3::FromBits(w.ptr<uint8_t>()[r * k + i]));
        acc += group * sx[t * kb + g] * scale.ptr<float>()[(r / 128) * ld + g];
      }
      err = std::max(err, std::fabs(acc - out.ptr<float>()[t * n + r]));
      ref_max = std::max(ref_max, std::fabs(acc));
    }
  }
  EXPECT_LT(err / ref_max, 1e-5);
}

}  // namespace
}  // namespace corolla
