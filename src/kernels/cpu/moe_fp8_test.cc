// The CPU twin of Backend::MoeExpertsFp8 against a direct evaluation of the block-scaled expert
// FFN: gate and up halves with their own scale blocks (I not a multiple of 128), partial blocks
// in H and I, ids outside [0, E) skipped; both activation regimes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "base/numeric.h"
#include "kernels/cpu/ops.h"

namespace corolla {
namespace {

float Fp8(uint8_t b) { return ToFloat(fp8e4m3::FromBits(b)); }

// x [rows, k] rounded through the 1 x 128 quantisation when `quantise`.
std::vector<double> MaybeQuantise(const std::vector<float>& x, int64_t rows, int64_t k, bool quantise) {
  std::vector<double> r(x.begin(), x.end());
  if (!quantise) return r;
  const int64_t groups = (k + kFp8Block - 1) / kFp8Block;
  Tensor t = Tensor::Empty(DType::kF32, {rows, k});
  std::copy(x.begin(), x.end(), t.ptr<float>());
  std::vector<uint8_t> q(rows * k);
  std::vector<float> s(rows * groups);
  cpu::QuantizeFp8Groups(t, q.data(), s.data());
  for (int64_t i = 0; i < rows * k; ++i) r[i] = double(Fp8(q[i])) * s[(i / k) * groups + (i % k) / kFp8Block];
  return r;
}

void CheckAgainstDirectSum(bool quantise) {
  const int64_t tokens = 5, hidden = 200, inter = 160, experts = 4, top_k = 2;
  const int64_t hb = 2, ib = 2;
  std::mt19937 rng(quantise ? 11 : 7);
  std::uniform_real_distribution<float> d(-1.f, 1.f), sd(0.002f, 0.02f);
  Tensor x = Tensor::Empty(DType::kF32, {tokens, hidden});
  Tensor wgu = Tensor::Empty(DType::kF8E4M3, {experts, 2 * inter, hidden});
  Tensor wd = Tensor::Empty(DType::kF8E4M3, {experts, hidden, inter});
  Tensor gus = Tensor::Empty(DType::kF32, {experts, 2 * ib, hb}), ds = Tensor::Empty(DType::kF32, {experts, hb, ib});
  for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = d(rng);
  for (int64_t i = 0; i < wgu.numel(); ++i) wgu.ptr<uint8_t>()[i] = ToFp8e4m3(64.f * d(rng)).bits;
  for (int64_t i = 0; i < wd.numel(); ++i) wd.ptr<uint8_t>()[i] = ToFp8e4m3(64.f * d(rng)).bits;
  for (int64_t i = 0; i < gus.numel(); ++i) gus.ptr<float>()[i] = sd(rng);
  for (int64_t i = 0; i < ds.numel(); ++i) ds.ptr<float>()[i] = sd(rng);
  Tensor ids = Tensor::Empty(DType::kI32, {tokens, top_k}), wts = Tensor::Empty(DType::kF32, {tokens, top_k});
  const int32_t id_list[] = {0, 1, 1, 3, -1, 2, 3, 0, 7, 1};  // -1 and 7: another rank's experts
  for (int64_t i = 0; i < tokens * top_k; ++i) ids.ptr<int32_t>()[i] = id_list[i], wts.ptr<float>()[i] = 0.3f + 0.1f * i;
  Tensor out = Tensor::Empty(DType::kF32, {tokens, hidden});
  cpu::MoeExpertsFp8(x, ids, wts, wgu, gus, wd, ds, out, quantise);

  const std::vector<float> xv(x.ptr<float>(), x.ptr<float>() + x.numel());
  const std::vector<double> xq = MaybeQuantise(xv, tokens, hidden, quantise);
  double err = 0, ref_max = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<double> ref(hidden, 0.0);
    for (int64_t s = 0; s < top_k; ++s) {
      const int e = ids.ptr<int32_t>()[t * top_k + s];
      if (e < 0 || e >= experts) continue;
      std::vector<float> act(inter);
      for (int64_t n = 0; n < inter; ++n) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < hidden; ++h) {
          const double xh = xq[t * hidden + h];
          g += xh * Fp8(wgu.ptr<uint8_t>()[(e * 2 * inter + n) * hidden + h]) *
               gus.ptr<float>()[(e * 2 * ib + n / 128) * hb + h / 128];
          u += xh * Fp8(wgu.ptr<uint8_t>()[(e * 2 * inter + inter + n) * hidden + h]) *
               gus.ptr<float>()[(e * 2 * ib + ib + n / 128) * hb + h / 128];
        }
        act[n] = static_cast<float>(g / (1 + std::exp(-g)) * u);
        if (quantise) act[n] = ToFloat(ToBf16(act[n]));  // the quantised regime's bf16 act
      }
      const std::vector<double> aq = MaybeQuantise(act, 1, inter, quantise);
      for (int64_t h = 0; h < hidden; ++h) {
        double y = 0;
        for (int64_t n = 0; n < inter; ++n)
          y += aq[n] * Fp8(wd.ptr<uint8_t>()[(e * hidden + h) * inter + n]) *
               ds.ptr<float>()[(e * hb + h / 128) * ib + n / 128];
        ref[h] += wts.ptr<float>()[t * top_k + s] * y;
      }
    }
    for (int64_t h = 0; h < hidden; ++h) {
      err = std::max(err, std::fabs(ref[h] - out.ptr<float>()[t * hidden + h]));
      ref_max = std::max(ref_max, std::fabs(ref[h]));
    }
  }
  EXPECT_GT(ref_max, 0.1);
  // f32 sums against f64 (the quantised regime may flip an act element's e4m3 rounding).
  EXPECT_LT(err / ref_max, quantise ? 2e-3 : 1e-5) << "max err " << err << " of " << ref_max;
}

TEST(CpuMoeExpertsFp8, WeightOnlyEqualsTheBlockScaledSum) { CheckAgainstDirectSum(false); }
TEST(CpuMoeExpertsFp8, QuantisedEqualsTheBlockScaledSum) { CheckAgainstDirectSum(true); }

}  // namespace
}  // namespace corolla
