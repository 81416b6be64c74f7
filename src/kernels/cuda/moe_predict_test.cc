// The batch-1 MoE routing prediction (Tuning().moe_predict): the staged o_proj GEMV, given
// Backend::HintMoeRouting's hint, predicts the layer's top-k experts before its dependency wait
// (gemv_staged.cuh's PredictMoeRouting) for the MoE's L2 prefetch (moe_decode.cu).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/moe_decode.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/test_util.h"

namespace corolla::cuda_test {
namespace {

// With the hint the GEMV's output is the same bits as without it; the predicted ids are the CPU's
// top k of router . (norm * sum) (a pick may differ only where its logit is within 1e-3 of the
// k-th's, the keys' and the sums' rounding), distinct, tagged with the launch's tag; the
// arrival counter is re-armed, so a second launch predicts again under its own tag. Norm weights
// bf16 and f32, E 128 / 64 / 100 / 16, k 8 / 4 / 6 / 1, H 2048 / 1024 / 512, o_proj shapes N x K
// 2048 x 4096 (16 rows a CTA on 132 SMs), 1024 x 2048 and 512 x 1024. Where the prediction is
// ruled out (E 256) or off, nothing is tagged and the output is the same.
TEST_F(CudaKernelTest, LinearGemvPredictsMoeRouting) {
  struct Restore {
    ~Restore() { cuda::Tuning() = DefaultTuning(); }
  } restore;
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
    // The CPU's logits from the same bf16 operands (x~ = norm * sum in f32, as the kernel forms it).
    std::vector<double> logits(e);
    for (int64_t i = 0; i < e; ++i) {
      double acc = 0;
      for (int64_t j = 0; j < h; ++j)
        acc += double(router[i * h + j]) * double(float(norm[j]) * float(sum[j]));
      logits[i] = acc;
    }
    std::vector<int> order(e);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    const double kth = logits[order[c.k - 1]];
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
      std::set<int> seen;
      for (int i = 0; i < c.k; ++i) {
        const int id = got[i];
        ASSERT_TRUE(id >= 0 && id < e) << shape << " pick " << i << " = " << id;
        EXPECT_TRUE(seen.insert(id).second) << shape << ": expert " << id << " picked twice";
        const bool top = std::find(order.begin(), order.begin() + c.k, id) != order.begin() + c.k;
        EXPECT_TRUE(top || std::abs(logits[id] - kth) <= 1e-3 * std::max(1.0, std::abs(kth)))
            << shape << ": expert " << id << " (logit " << logits[id] << ") is not in the top " << c.k
            << " (k-th " << kth << ")";
      }
    }
  }
}

}  // namespace
}  // namespace corolla::cuda_test
