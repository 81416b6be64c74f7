// Embedding, norms, RoPE, SiLU-mul and add on the CPU.
#include <cmath>
#include <cstring>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/ops.h"

namespace corolla::cpu {
namespace {

float* Row(const TensorView& t, int64_t i) { return t.ptr<float>() + i * t.strides[0]; }

void CheckF32(const TensorView& t, const char* what) {
  COROLLA_CHECK(t.dtype == DType::kF32 && t.device == Device::kCpu) << what << " " << t.ToString();
}

// y = w * x / sqrt(mean(x^2) + eps), accumulated in double for a stable reference.
void NormRow(const float* x, const float* w, int64_t n, float eps, float* y) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  float inv = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * inv);
}

}  // namespace

void Embedding(const TensorView& ids, const TensorView& table, const TensorView& out) {
  CheckF32(table, "embedding table");
  CheckF32(out, "embedding out");
  COROLLA_CHECK(ids.dtype == DType::kI32 && ids.numel() == out.dim(0) && table.dim(1) == out.dim(1));
  const int32_t* id = ids.ptr<int32_t>();
  int64_t hidden = table.dim(1), vocab = table.dim(0);
  for (int64_t t = 0; t < ids.numel(); ++t) {
    COROLLA_CHECK(id[t] >= 0 && id[t] < vocab) << "token id " << id[t];
    std::memcpy(Row(out, t), Row(table, id[t]), hidden * sizeof(float));
  }
}

void RmsNorm(const TensorView& x, const TensorView& w, float eps, const TensorView& out,
             const TensorView* residual) {
  CheckF32(x, "rmsnorm x");
  CheckF32(out, "rmsnorm out");
  int64_t rows = x.dim(0), n = x.dim(1);
  COROLLA_CHECK(w.numel() == n && out.dim(0) == rows && out.dim(1) == n);
  ThreadPool::Default().ParallelFor(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* src = Row(x, r);
      if (residual != nullptr) {
        float* res = Row(*residual, r);
        for (int64_t i = 0; i < n; ++i) res[i] += src[i];
        src = res;
      }
      NormRow(src, w.ptr<float>(), n, eps, Row(out, r));
    }
  });
}

void HeadRmsNorm(const TensorView& x, const TensorView& w, float eps) {
  CheckF32(x, "head rmsnorm x");
  COROLLA_CHECK(x.rank() == 3 && w.numel() == x.dim(2) && x.strides[2] == 1);
  int64_t tokens = x.dim(0), heads = x.dim(1), d = x.dim(2);
  ThreadPool::Default().ParallelFor(tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        float* p = x.ptr<float>() + t * x.strides[0] + h * x.strides[1];
        NormRow(p, w.ptr<float>(), d, eps, p);
      }
  });
}

void Rope(const TensorView& q, const TensorView& k, const TensorView& positions,
          const RopeParams& params) {
  CheckF32(q, "rope q");
  CheckF32(k, "rope k");
  int64_t tokens = q.dim(0), d = q.dim(2);
  int rot = params.rotary_dim, half = rot / 2;
  COROLLA_CHECK(rot > 0 && rot % 2 == 0 && rot <= d && k.dim(0) == tokens && k.dim(2) == d);
  const std::vector<float> inv_freq = RopeInvFreq(params);
  const int32_t* pos = positions.ptr<int32_t>();
  ThreadPool::Default().ParallelFor(tokens, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_v(half), sin_v(half);
    for (int64_t t = begin; t < end; ++t) {
      for (int i = 0; i < half; ++i) {
        float angle = static_cast<float>(pos[t]) * inv_freq[i];
        cos_v[i] = std::cos(angle) * params.attention_factor;
        sin_v[i] = std::sin(angle) * params.attention_factor;
      }
      // Pair i is (i, i + half) in neox style, (2i, 2i + 1) when interleaved.
      const int stride = params.interleaved ? 2 : 1, partner = params.interleaved ? 1 : half;
      for (const TensorView* x : {&q, &k}) {
        for (int64_t h = 0; h < x->dim(1); ++h) {
          float* p = x->ptr<float>() + t * x->strides[0] + h * x->strides[1];
          for (int i = 0; i < half; ++i) {
            float& a = p[i * stride];
            float& b = p[i * stride + partner];
            float a0 = a, b0 = b;
            a = a0 * cos_v[i] - b0 * sin_v[i];
            b = b0 * cos_v[i] + a0 * sin_v[i];
          }
        }
      }
    }
  });
}

void SiluMul(const TensorView& gate_up, const TensorView& out) {
  CheckF32(gate_up, "silu_mul in");
  CheckF32(out, "silu_mul out");
  int64_t rows = out.dim(0), inter = out.dim(1);
  COROLLA_CHECK(gate_up.dim(0) == rows && gate_up.dim(1) == 2 * inter);
  ThreadPool::Default().ParallelFor(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = Row(gate_up, r);
      const float* u = g + inter;
      float* o = Row(out, r);
      for (int64_t i = 0; i < inter; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  });
}

void GatherRows(const TensorView& x, const TensorView& rows, const TensorView& out) {
  CheckF32(x, "gather x");
  CheckF32(out, "gather out");
  COROLLA_CHECK(rows.dtype == DType::kI32 && rows.numel() == out.dim(0) && x.dim(1) == out.dim(1));
  for (int64_t i = 0; i < rows.numel(); ++i) {
    int32_t r = rows.ptr<int32_t>()[i];
    COROLLA_CHECK(r >= 0 && r < x.dim(0)) << "row " << r;
    std::memcpy(Row(out, i), Row(x, r), x.dim(1) * sizeof(float));
  }
}

void Copy(const TensorView& src, const TensorView& dst) {
  COROLLA_CHECK(src.shape == dst.shape && src.dtype == dst.dtype && src.rank() >= 1 && src.rank() <= 3 &&
                src.strides[src.rank() - 1] == 1 && dst.strides[dst.rank() - 1] == 1)
      << "copy " << src.ToString() << " to " << dst.ToString();
  const int r = src.rank();
  const int64_t d0 = r >= 3 ? src.dim(0) : 1, d1 = r >= 2 ? src.dim(r - 2) : 1, inner = src.dim(r - 1);
  const int64_t size = DTypeSize(src.dtype);
  for (int64_t i = 0; i < d0; ++i)
    for (int64_t j = 0; j < d1; ++j) {
      int64_t s_off = (r >= 3 ? i * src.strides[0] : 0) + (r >= 2 ? j * src.strides[r - 2] : 0);
      int64_t d_off = (r >= 3 ? i * dst.strides[0] : 0) + (r >= 2 ? j * dst.strides[r - 2] : 0);
      std::memcpy(static_cast<char*>(dst.data) + d_off * size, static_cast<const char*>(src.data) + s_off * size,
                  inner * size);
    }
}

void Add(const TensorView& x, const TensorView& y) {
  CheckF32(x, "add x");
  CheckF32(y, "add y");
  COROLLA_CHECK(x.shape == y.shape);
  for (int64_t r = 0; r < x.dim(0); ++r) {
    float* a = Row(x, r);
    const float* b = Row(y, r);
    for (int64_t i = 0; i < x.dim(1); ++i) a[i] += b[i];
  }
}

}  // namespace corolla::cpu
