// The batch-1 MoE routing prediction (Tuning().moe_predict): the staged o_proj GEMV, given
// Backend::HintMoeRouting's hint, predicts the layer's top-k experts before its dependency wait
// (gemv_staged.cuh's PredictMoeRouting) for the MoE's L2 prefetch (moe_decode.cu).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/moe_decode.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/test_util.h"

namespace corolla::cuda_test {
namespace {

// The CPU's logits router . (norm * sum) from the same bf16 operands (x~ = norm * sum in f32, as
// the kernels form it) and the experts in their order.
struct CpuRanking {
  std::vector<double> logits;
  std::vector<int> order;
};
CpuRanking RankExperts(const std::vector<float>& router, const std::vector<float>& norm, const std::vector<float>& sum,
                       int64_t experts, int64_t hidden) {
  CpuRanking r{std::vector<double>(experts), std::vector<int>(experts)};
  for (int64_t i = 0; i < experts; ++i) {
    double acc = 0;
    for (int64_t j = 0; j < hidden; ++j)
      acc += double(router[i * hidden + j]) * double(float(norm[j]) * float(sum[j]));
    r.logits[i] = acc;
  }
  std::iota(r.order.begin(), r.order.end(), 0);
  std::stable_sort(r.order.begin(), r.order.end(), [&](int a, int b) { return r.logits[a] > r.logits[b]; });
  return r;
}

// got's first k ids: distinct experts of the CPU's top k (a pick may differ only where its logit
// is within 1e-3 of the k-th's, the keys' and the sums' rounding).
void ExpectTopK(const std::vector<int32_t>& got, const CpuRanking& r, int k, const std::string& shape) {
  const int64_t e = static_cast<int64_t>(r.logits.size());
  const double kth = r.logits[r.order[k - 1]];
  std::set<int> seen;
  for (int i = 0; i < k; ++i) {
    const int id = got[i];
    ASSERT_TRUE(id >= 0 && id < e) << shape << " pick " << i << " = " << id;
    EXPECT_TRUE(seen.insert(id).second) << shape << ": expert " << id << " picked twice";
    const bool top = std::find(r.order.begin(), r.order.begin() + k, id) != r.order.begin() + k;
    EXPECT_TRUE(top || std::abs(r.logits[id] - kth) <= 1e-3 * std::max(1.0, std::abs(kth)))
        << shape << ": expert " << id << " (logit " << r.logits[id] << ") is not in the top " << k << " (k-th " << kth
        << ")";
  }
}

// With the hint the GEMV's output is the same bits as without it; the predicted ids are the CPU's
// top k of router . (norm * sum) (a pick may differ only where its logit is within 1e-3 of the
// k-th's, the keys' and the sums' rounding), distinct, tagged with the launch's tag; the
// arrival counter is re-armed, so a second launch predicts again under its own tag. Norm weights
// bf16 and f32, E 128 / 64 / 100 / 16, k 8 / 4 / 6 / 1, H 2048 / 1024 / 512, o_proj shapes N x K
// 2048 x 4096 (16 rows a CTA on 132 SMs), 1024 x 2048 and 512 x 1024. Where the prediction is
// ruled out (E 256) or off, nothing is tagged and the output is the same.
TEST_F(CudaKernelTest, LinearGemvPredictsMoeRouting) {
  const TuningRestore restore;
  cudaStream_t stream = dynamic_cast<cuda::CudaBackend&>(gpu()).stream();
  struct Case {
    int experts, k;
    int64_t hidden, n, kin;
    bool norm_f32;
  };
  for (const Case c : {Case{128, 8, 2048, 2048, 4096, false}, Case{64, 4, 1024, 1024, 2048, true},
                       Case{100, 6, 2048, 2048, 4096, false}, Case{16, 1, 512, 512, 1024, true},
                       Case{256, 8, 2048, 2048, 4096, false}}) {
    const int64_t e = c.experts, h = c.hidden;
    const auto router = RandomBf16(e * h, 3.f / std::sqrt(float(h))), sum = RandomBf16(h, 4.f),
               x = RandomBf16(c.kin), w = RandomBf16(c.n * c.kin, 1.f / std::sqrt(float(c.kin)));
    std::vector<float> norm = RandomBf16(h, 0.5f);
    for (float& v : norm) v = c.norm_f32 ? v + 1.f : ToFloat(ToBf16(v + 1.f));  // as uploaded
    Tensor grouter = gpu().LoadWeight(HostF32(router, {e, h})), gw = gpu().LoadWeight(HostF32(w, {c.n, c.kin}));
    Tensor gnorm = Upload(gpu(), norm, {h}, c.norm_f32 ? DType::kF32 : DType::kBF16);
    Tensor gsum = Upload(gpu(), sum, {1, h}, DType::kBF16), gx = Upload(gpu(), x, {1, c.kin}, DType::kBF16);
    const CpuRanking ranking = RankExperts(router, norm, sum, e, h);
    const bool predicts = e <= cuda::kMoePredictionMaxExperts;
    const std::string shape = "E" + std::to_string(e) + " k" + std::to_string(c.k) + " H" + std::to_string(h) +
                              (c.norm_f32 ? " f32-norm" : "");
    auto gemv = [&](bool hinted) {
      cuda::Tuning().moe_predict = hinted;
      cuda::Tuning().moe_prefetch_previous = hinted ? 2 : 0;
      Tensor out = gpu().Empty(DType::kBF16, {1, c.n});
      Poison(gpu(), out);
      const cuda::MoeRouteHint hint{gnorm.view(), gsum.view(), grouter.view(), c.k};
      EXPECT_TRUE(cuda::LinearGemv(gx, gw, out, stream, &hint)) << shape;
      return Download(gpu(), out);
    };
    const std::vector<float> want = gemv(false);
    int32_t* picks = cuda::MoePredictedPicks(stream);
    ASSERT_NE(picks, nullptr);
    for (int round = 0; round < 2; ++round) {
      const int tag_before = cuda::NextMoePredictionTag(stream);  // (the next launch's is this + 1)
      EXPECT_EQ(gemv(true), want) << shape << ": the hint changed the output";
      std::vector<int32_t> got(cuda::kMoePredictionInts);
      ASSERT_EQ(cudaMemcpy(got.data(), picks, got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(got[cuda::kMoePredictionArrivals], 0) << shape << ": the counter is not re-armed";
      if (!predicts) {
        EXPECT_NE(got[cuda::kMoePredictionTag], tag_before + 1)
            << shape << ": tagged where E rules the prediction out";
        continue;
      }
      EXPECT_EQ(got[cuda::kMoePredictionTag], tag_before + 1) << shape << " round " << round;
      ExpectTopK(got, ranking, c.k, shape);
    }
  }
}

// Tuning().moe_prefetch_qkv(_predict): the batch-1 qkv projection (NormLinear) given the hint
// prefetches expert rows into L2 as its CTAs leave, from the last forward's picks or, predicted,
// from MoePredictKernel's launched just before it. Neither changes the projection's bits or the
// normed row it writes; the prediction is the CPU's top k of router . (norm * sum) as above,
// tagged by its own launch, with the counter re-armed. E 128 / 64, k 8 / 4, H 2048 / 1024.
TEST_F(CudaKernelTest, NormLinearPrefetchesPredictedExperts) {
  const TuningRestore restore;
  cudaStream_t stream = dynamic_cast<cuda::CudaBackend&>(gpu()).stream();
  struct Case {
    int experts, k;
    int64_t hidden, inter, n;
  };
  for (const Case c : {Case{128, 8, 2048, 256, 5120}, Case{64, 4, 1024, 128, 2560}}) {
    const int64_t e = c.experts, h = c.hidden;
    const auto router = RandomBf16(e * h, 3.f / std::sqrt(float(h))), sum = RandomBf16(h, 4.f),
               w = RandomBf16(c.n * h, 1.f / std::sqrt(float(h)));
    std::vector<float> norm = RandomBf16(h, 0.5f), in_norm = RandomBf16(h, 0.5f);
    for (float& v : norm) v = ToFloat(ToBf16(v + 1.f));
    for (float& v : in_norm) v = ToFloat(ToBf16(v + 1.f));
    Tensor grouter = gpu().LoadWeight(HostF32(router, {e, h})), gw = gpu().LoadWeight(HostF32(w, {c.n, h}));
    Tensor gnorm = Upload(gpu(), norm, {h}, DType::kBF16), gin = Upload(gpu(), in_norm, {h}, DType::kBF16);
    Tensor gsum = Upload(gpu(), sum, {1, h}, DType::kBF16);
    Tensor gate_up = gpu().Empty(DType::kBF16, {e, 2 * c.inter, h}), down = gpu().Empty(DType::kBF16, {e, h, c.inter});
    Poison(gpu(), gate_up);
    Poison(gpu(), down);
    const CpuRanking ranking = RankExperts(router, norm, sum, e, h);
    const std::string shape = "E" + std::to_string(e) + " k" + std::to_string(c.k) + " H" + std::to_string(h);
    // The projection and the normed row, with the hint under `rows` prefetched rows (0: no hint).
    auto project = [&](int rows, bool predict) {
      cuda::Tuning().moe_prefetch_qkv = rows;
      cuda::Tuning().moe_prefetch_qkv_down = rows;
      cuda::Tuning().moe_prefetch_qkv_predict = predict;
      Tensor out = gpu().Empty(DType::kBF16, {1, c.n}), x = gpu().Empty(DType::kBF16, {1, h});
      Poison(gpu(), out);
      Poison(gpu(), x);
      const cuda::MoeRouteHint hint{gnorm.view(), gsum.view(), grouter.view(), c.k, gate_up.view(), down.view()};
      EXPECT_TRUE(cuda::NormLinear(gin, 1e-6f, gsum, x, gw, out, stream, rows > 0 ? &hint : nullptr)) << shape;
      std::vector<float> got = Download(gpu(), out), xs = Download(gpu(), x);
      got.insert(got.end(), xs.begin(), xs.end());
      return got;
    };
    const std::vector<float> want = project(0, false);
    EXPECT_EQ(project(256, false), want) << shape << ": the last forward's prefetch changed the output";
    int32_t* picks = cuda::MoePredictedPicks(stream);
    ASSERT_NE(picks, nullptr);
    for (int round = 0; round < 2; ++round) {
      const int tag_before = cuda::NextMoePredictionTag(stream);
      EXPECT_EQ(project(128, true), want) << shape << ": the prediction changed the output";
      std::vector<int32_t> got(cuda::kMoePredictionInts);
      ASSERT_EQ(cudaMemcpy(got.data(), picks, got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(got[cuda::kMoePredictionArrivals], 0) << shape << ": the counter is not re-armed";
      EXPECT_EQ(got[cuda::kMoePredictionTag], tag_before + 1) << shape << " round " << round;
      ExpectTopK(got, ranking, c.k, shape);
    }
  }
}

}  // namespace
}  // namespace corolla::cuda_test
