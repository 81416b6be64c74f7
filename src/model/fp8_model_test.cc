// DeepSeek-V3's FP8 fixture with native FP8 projections (COROLLA_FP8=native: the CPU twin of
// the block-scaled GEMMs, activations quantised per 1 x 128 group) against the default
// dequantised load, which matches the float32 golden to 1e-4: the error the activation
// quantisation adds to the whole model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "model/model.h"

namespace corolla {
namespace {

// Logits [8, V] of one prompt of 8 tokens in one prefill.
Tensor Logits(Model& model) {
  const int n = 8;
  KvCacheSpec spec = model.kv_cache_spec();
  std::vector<Tensor> kv;
  std::vector<KvCacheView> views;
  for (int l = 0; l < spec.num_layers; ++l) {
    kv.push_back(Tensor::Zeros(DType::kF32, {1, spec.num_kv_heads, n, spec.head_dim}));
    views.push_back({kv.back().view(), kv.back().view()});  // MLA: one latent tensor
  }
  Tensor ids = Tensor::Empty(DType::kI32, {n}), pos = Tensor::Empty(DType::kI32, {n});
  Tensor qstart = Tensor::Empty(DType::kI32, {2}), lens = Tensor::Empty(DType::kI32, {1});
  Tensor table = Tensor::Zeros(DType::kI32, {1, 1}), rows = Tensor::Empty(DType::kI32, {n});
  for (int i = 0; i < n; ++i) {
    ids.ptr<int32_t>()[i] = (97 * i + 5) % static_cast<int>(model.config().vocab_size);
    pos.ptr<int32_t>()[i] = rows.ptr<int32_t>()[i] = i;
  }
  qstart.ptr<int32_t>()[0] = 0;
  qstart.ptr<int32_t>()[1] = lens.ptr<int32_t>()[0] = n;
  ForwardBatch batch{ids, pos, {qstart, lens, table, pos, n, n}, rows};
  Tensor logits = Tensor::Empty(DType::kF32, {n, model.config().vocab_size});
  model.Forward(batch, views, logits);
  return logits;
}

std::unique_ptr<Model> LoadWith(const char* fp8_mode, Backend& backend) {
  setenv("COROLLA_FP8", fp8_mode, 1);
  auto model = LoadModel("tests/data/models/deepseek-v3-fp8", backend);
  unsetenv("COROLLA_FP8");
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? std::move(model).value() : nullptr;
}

TEST(Fp8Native, DeepseekFixtureWithinFp8ToleranceOfTheDequantisedModel) {
  auto backend = MakeCpuBackend();
  auto dequant = LoadWith("dequant", *backend);
  auto native = LoadWith("native", *backend);
  ASSERT_TRUE(dequant && native);
  Tensor want = Logits(*dequant), got = Logits(*native);
  const int64_t vocab = want.dim(1);
  double worst = 0, sum = 0;
  for (int64_t r = 0; r < want.dim(0); ++r) {
    double err = 0, scale = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      err = std::max(err, static_cast<double>(std::fabs(got.ptr<float>()[r * vocab + j] - want.ptr<float>()[r * vocab + j])));
      scale = std::max(scale, static_cast<double>(std::fabs(want.ptr<float>()[r * vocab + j])));
    }
    worst = std::max(worst, err / scale);
    sum += err / scale;
  }
  std::printf("deepseek-v3-fp8 native FP8 (CPU twin) vs dequantised: max |diff| / max |ref| per row: worst %.3g, mean %.3g\n",
              worst, sum / want.dim(0));
  EXPECT_GT(worst, 0.0) << "native FP8 ran no quantised GEMM";
  EXPECT_LT(worst, 0.1);
}

TEST(Fp8Native, RejectsAnUnknownMode) {
  auto backend = MakeCpuBackend();
  setenv("COROLLA_FP8", "fp4", 1);
  auto model = LoadModel("tests/data/models/deepseek-v3-fp8", *backend);
  unsetenv("COROLLA_FP8");
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().ToString().find("expected native or dequant"), std::string::npos) << model.status().ToString();
}

}  // namespace
}  // namespace corolla
