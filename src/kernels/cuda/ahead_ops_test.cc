// Backend::NormLinearAhead / AwaitAhead on CUDA (gemv_ahead.cu): the op issued ahead of the
// kernel that completes its sum (an Add on the main stream, as the MoE's folded down kernel in a
// decode step) and awaited after it, inside a captured graph, equals NormLinear run after the
// Add bit for bit (x and out: the same staged kernel, the same rows a CTA and a warp), over
// Qwen3-30B-A3B's qkv (2048 -> 5120) and odd shapes, with 0, 1 and 3 warps a CTA reading their
// rows from global memory; each graph replayed three times on fresh sums (the flags re-arm
// themselves). Eagerly the op runs at its await (ops.h says why): the same bits again.
// Filter: --gtest_filter='*NormLinearAhead*'
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cuda/ops.h"
#include "kernels/cuda/test_util.h"

namespace corolla::cuda_test {
namespace {

TEST_F(CudaKernelTest, NormLinearAhead) {
  struct Restore {
    ~Restore() { cuda::Tuning() = DefaultTuning(); }
  } restore;
  Backend& be = gpu();
  struct Case { int64_t n, k; };
  for (int global_warps : {1, 0, 3})
    for (Case c : {Case{5120, 2048}, Case{1000, 1024}, Case{72, 136}, Case{3, 8}}) {
      cuda::Tuning().norm_linear_ahead_global_warps = global_warps;
      const std::string shape = "N" + std::to_string(c.n) + " K" + std::to_string(c.k) + " global warps " +
                                std::to_string(global_warps);
      std::vector<float> norm = RandomBf16(c.k, 0.5f);
      for (float& v : norm) v += 1.f;
      const Tensor gw = be.LoadWeight(HostF32(RandomBf16(c.n * c.k, 1.f / std::sqrt(float(c.k))), {c.n, c.k}));
      const Tensor gnorm = Upload(be, norm, {c.k}, DType::kBF16);
      Tensor gsum = be.Empty(DType::kBF16, {1, c.k}), gy = be.Empty(DType::kBF16, {1, c.k});
      Tensor gx = be.Empty(DType::kBF16, {1, c.k}), gout = be.Empty(DType::kBF16, {1, c.n});
      Tensor rx = be.Empty(DType::kBF16, {1, c.k}), rout = be.Empty(DType::kBF16, {1, c.n});
      Tensor saved_sum;  // gsum before the step's Add
      auto fill = [&](const TensorView& t, float scale) {
        const std::vector<float> v = RandomBf16(t.numel(), scale);
        std::vector<bf16> h(v.size());
        for (size_t i = 0; i < v.size(); ++i) h[i] = ToBf16(v[i]);
        be.CopyFromHost(h.data(), t);
      };
      // The step: issue, complete the sum, await.
      auto step = [&] {
        be.NormLinearAhead(gnorm, 1e-6f, gsum, gx, gw, gout);
        be.Add(gsum, gy);
        be.AwaitAhead();
      };
      // The reference from the same sum and y: Add, then NormLinear, into rx / rout (sum is
      // added a second time on a copy).
      auto check = [&](const std::string& what) {
        const std::vector<float> x = Download(be, gx), out = Download(be, gout);
        Tensor sum = be.Empty(DType::kBF16, {1, c.k});
        be.Copy(saved_sum, sum);
        be.Add(sum, gy);
        Poison(be, rx);
        Poison(be, rout);
        be.NormLinear(gnorm, 1e-6f, sum, rx, gw, rout);
        EXPECT_EQ(Download(be, sum), Download(be, gsum)) << shape << " " << what;
        EXPECT_EQ(x, Download(be, rx)) << shape << " " << what;
        EXPECT_EQ(out, Download(be, rout)) << shape << " " << what;
      };
      auto fresh = [&] {
        fill(gsum, 4.f);
        fill(gy, 1.f);
        saved_sum = be.Empty(DType::kBF16, {1, c.k});
        be.Copy(gsum, saved_sum);
        Poison(be, gx);
        Poison(be, gout);
      };
      fresh();
      const int64_t launches = cuda::NormLinearAheadLaunches();
      step();  // eager: the op runs at the await
      EXPECT_EQ(cuda::NormLinearAheadLaunches(), launches) << shape;
      check("eager");
      fresh();  // the capture's warm-up run (eager) reads it
      auto graph = be.CaptureGraph(step);
      ASSERT_TRUE(graph.ok()) << shape << ": " << graph.status().ToString();
      EXPECT_EQ(cuda::NormLinearAheadLaunches(), launches + 1) << shape << ": the capture issued the op ahead";
      for (int rep = 0; rep < 3; ++rep) {
        fresh();
        (*graph)->Replay();
        check("replay " + std::to_string(rep));
      }
    }
}

}  // namespace
}  // namespace corolla::cuda_test
