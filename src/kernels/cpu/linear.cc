// Dense projections through OpenBLAS sgemm (float32; weights were widened at load), and the
// FP8 block-scaled twin (activations quantised per 1 x 128 group, weights dequantised per call).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/numeric.h"
#include "base/thread_pool.h"
#include "kernels/cpu/ops.h"

namespace corolla::cpu {

void Linear(const TensorView& x, const TensorView& w, const TensorView& out) {
  COROLLA_CHECK(x.dtype == DType::kF32 && w.dtype == DType::kF32 && out.dtype == DType::kF32)
      << "linear x " << x.ToString() << " w " << w.ToString() << " out " << out.ToString();
  int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  COROLLA_CHECK(w.dim(1) == k && out.dim(0) == m && out.dim(1) == n && w.is_contiguous())
      << "linear x " << x.ToString() << " w " << w.ToString() << " out " << out.ToString();
  if (m == 0) return;
  int64_t ldx = m > 1 ? x.strides[0] : k;
  int64_t ldo = m > 1 ? out.strides[0] : n;
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w.ptr<float>(), k, x.ptr<float>(), 1,
                0.0f, out.ptr<float>(), 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x.ptr<float>(), ldx,
              w.ptr<float>(), k, 0.0f, out.ptr<float>(), ldo);
}

void BatchedLinear(const TensorView& x, const TensorView& w, const TensorView& out) {
  COROLLA_CHECK(x.rank() == 3 && w.rank() == 3 && out.rank() == 3 && w.dim(0) == x.dim(1) &&
                out.dim(1) == x.dim(1) && w.dim(2) == x.dim(2) && out.dim(0) == x.dim(0) &&
                out.dim(2) == w.dim(1) && x.strides[2] == 1 && out.strides[2] == 1)
      << "batched linear x " << x.ToString() << " w " << w.ToString() << " out " << out.ToString();
  // [T, K] view of batch b of a [T, B, K] view.
  auto batch = [](const TensorView& t, int64_t b) {
    TensorView v = t;
    v.data = static_cast<char*>(t.data) + b * t.strides[1] * DTypeSize(t.dtype);
    v.shape = {t.dim(0), t.dim(2)};
    v.strides = {t.strides[0], 1, 0, 0};
    return v;
  };
  for (int64_t b = 0; b < x.dim(1); ++b) Linear(batch(x, b), w.Index(b), batch(out, b));
}

}  // namespace corolla::cpu

namespace corolla::cpu {

void QuantizeFp8Groups(const TensorView& x, uint8_t* q, float* scales) {
  COROLLA_CHECK(x.dtype == DType::kF32 && x.rank() == 2) << "fp8 quantise x " << x.ToString();
  const int64_t rows = x.dim(0), k = x.dim(1), groups = (k + kFp8Block - 1) / kFp8Block;
  ThreadPool::Default().ParallelFor(rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* xr = x.ptr<float>() + t * x.strides[0];
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t k0 = g * kFp8Block, k1 = std::min(k, k0 + kFp8Block);
        float amax = 0.0f;
        for (int64_t i = k0; i < k1; ++i) amax = std::max(amax, std::fabs(xr[i]));
        const float s = std::max(amax, kFp8MinAmax) / kFp8Max;
        scales[t * groups + g] = s;
        for (int64_t i = k0; i < k1; ++i) q[t * k + i] = ToFp8e4m3(xr[i] / s).bits;
      }
    }
  });
}

// The activations quantised and dequantised, the weight dequantised, both in f32, then one
// sgemm: the same products as the block-scaled sum up to f32 rounding of the scale products.
void LinearFp8(const TensorView& x, const TensorView& w, const TensorView& w_scale, const TensorView& out) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  const int64_t groups = (k + kFp8Block - 1) / kFp8Block, n_blocks = (n + kFp8Block - 1) / kFp8Block;
  COROLLA_CHECK(x.dtype == DType::kF32 && w.dtype == DType::kF8E4M3 && w_scale.dtype == DType::kF32 &&
                out.dtype == DType::kF32 && x.rank() == 2 && w.rank() == 2 && w_scale.rank() == 2 &&
                w.dim(1) == k && w.is_contiguous() && w_scale.dim(0) == n_blocks && w_scale.dim(1) == groups &&
                w_scale.strides[1] == 1 && out.rank() == 2 && out.dim(0) == m && out.dim(1) == n)
      << "linear fp8 x " << x.ToString() << " w " << w.ToString() << " w_scale " << w_scale.ToString() << " out "
      << out.ToString();
  if (m == 0) return;
  float lut[256];
  for (int b = 0; b < 256; ++b) lut[b] = ToFloat(fp8e4m3::FromBits(static_cast<uint8_t>(b)));
  Tensor wd = Tensor::Empty(DType::kF32, {n, k});
  ThreadPool::Default().ParallelFor(n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* src = w.ptr<uint8_t>() + r * k;
      const float* s = w_scale.ptr<float>() + (r / kFp8Block) * w_scale.strides[0];
      float* dst = wd.ptr<float>() + r * k;
      for (int64_t i = 0; i < k; ++i) dst[i] = lut[src[i]] * s[i / kFp8Block];
    }
  });
  std::vector<uint8_t> q(m * k);
  std::vector<float> sx(m * groups);
  QuantizeFp8Groups(x, q.data(), sx.data());
  Tensor xd = Tensor::Empty(DType::kF32, {m, k});
  for (int64_t t = 0; t < m; ++t)
    for (int64_t i = 0; i < k; ++i) xd.ptr<float>()[t * k + i] = lut[q[t * k + i]] * sx[t * groups + i / kFp8Block];
  Linear(xd, wd, out);
}

}  // namespace corolla::cpu
