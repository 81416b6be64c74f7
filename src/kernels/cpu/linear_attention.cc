// Gated DeltaNet on the CPU: causal conv1d with a rolling state, the gated delta rule in its
// recurrent form (the reference every chunked kernel is checked against), the gated RMSNorm,
// and the sigmoid gates of gated attention and the shared expert. float32 math throughout. A bf16
// recurrent state is stored as bf16 and widened on read: each sequence's chunk starts from the
// widened state, runs in f32 and writes it back rounded to nearest even once at its end, as
// the CUDA kernel does (so decoding rounds after every token, one prefill chunk once).
#include <cmath>
#include <cstring>
#include <vector>

#include "base/numeric.h"
#include "base/thread_pool.h"
#include "kernels/cpu/ops.h"

namespace corolla::cpu {
namespace {

struct SeqRange {
  int64_t begin, end;  // rows of the flat batch
  bool fresh;          // the chunk starts at position 0: the state starts at zero
  int32_t slot;
};

std::vector<SeqRange> Sequences(const AttentionBatch& batch, const TensorView& state_slots) {
  const int64_t n = batch.seq_lens.numel();
  COROLLA_CHECK(state_slots.numel() == n && state_slots.dtype == DType::kI32);
  const int32_t* qs = batch.query_start.ptr<int32_t>();
  const int32_t* lens = batch.seq_lens.ptr<int32_t>();
  std::vector<SeqRange> out(n);
  for (int64_t b = 0; b < n; ++b)
    out[b] = {qs[b], qs[b + 1], lens[b] - (qs[b + 1] - qs[b]) == 0, state_slots.ptr<int32_t>()[b]};
  return out;
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }
float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace

void SigmoidMul(const TensorView& x, const TensorView& gate) {
  const int64_t rows = x.dim(0), n = x.dim(1), groups = gate.dim(1);
  COROLLA_CHECK(x.dtype == DType::kF32 && gate.dtype == DType::kF32 && gate.dim(0) == rows && n % groups == 0);
  const int64_t width = n / groups;
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x.ptr<float>() + r * x.strides[0];
    const float* g = gate.ptr<float>() + r * gate.strides[0];
    for (int64_t i = 0; i < n; ++i) xr[i] *= 1.0f / (1.0f + std::exp(-g[i / width]));
  }
}

void CausalConv1d(const TensorView& x, const TensorView& weight, const TensorView& conv_state,
                  const TensorView& state_slots, const AttentionBatch& batch, const TensorView& out) {
  const int64_t channels = x.dim(1), kernel = weight.dim(1), hist = kernel - 1;
  COROLLA_CHECK(weight.dim(0) == channels && conv_state.dim(1) == channels && conv_state.dim(2) == hist &&
                out.dim(1) == channels && x.dtype == DType::kF32 && conv_state.dtype == DType::kF32)
      << "conv1d x " << x.ToString() << " weight " << weight.ToString() << " state " << conv_state.ToString();
  for (const SeqRange& s : Sequences(batch, state_slots)) {
    COROLLA_CHECK(s.slot >= 0 && s.slot < conv_state.dim(0)) << "state slot " << s.slot;
    float* state = conv_state.ptr<float>() + s.slot * conv_state.strides[0];  // [C, K-1]
    if (s.fresh) std::fill_n(state, channels * hist, 0.0f);
    ThreadPool::Default().ParallelFor(channels, 64, [&](int64_t c0, int64_t c1) {
      std::vector<float> window(hist + (s.end - s.begin));
      for (int64_t c = c0; c < c1; ++c) {
        // The channel's inputs: its K-1 remembered ones, then the chunk's.
        float* st = state + c * hist;
        std::copy_n(st, hist, window.begin());
        for (int64_t t = s.begin; t < s.end; ++t) window[hist + t - s.begin] = x.ptr<float>()[t * x.strides[0] + c];
        const float* w = weight.ptr<float>() + c * kernel;
        for (int64_t t = s.begin; t < s.end; ++t) {
          const float* in = window.data() + (t - s.begin);  // inputs t-K+1 .. t
          float acc = 0;
          for (int64_t j = 0; j < kernel; ++j) acc += w[j] * in[j];
          out.ptr<float>()[t * out.strides[0] + c] = Silu(acc);
        }
        std::copy_n(window.end() - hist, hist, st);
      }
    });
  }
}

void GatedDeltaRule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& a,
                    const TensorView& b, const TensorView& a_log, const TensorView& dt_bias,
                    const TensorView& state, const TensorView& state_slots, const AttentionBatch& batch,
                    const TensorView& out) {
  const int64_t hk = q.dim(1), dk = q.dim(2), hv = v.dim(1), dv = v.dim(2);
  COROLLA_CHECK(hv % hk == 0 && k.dim(1) == hk && k.dim(2) == dk && state.dim(1) == hv && state.dim(2) == dk &&
                state.dim(3) == dv && a.dim(1) == hv && b.dim(1) == hv && out.dim(1) == hv && out.dim(2) == dv)
      << "gated delta rule q " << q.ToString() << " v " << v.ToString() << " state " << state.ToString();
  const bool bf16_state = state.dtype == DType::kBF16;
  COROLLA_CHECK((state.dtype == DType::kF32 || bf16_state) && state.strides[2] == dv && state.strides[3] == 1)
      << "gated delta rule state: expected f32 or bf16 with contiguous [Dk, Dv] heads, got " << state.ToString();
  const int64_t group = hv / hk;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (const SeqRange& s : Sequences(batch, state_slots)) {
    COROLLA_CHECK(s.slot >= 0 && s.slot < state.dim(0)) << "state slot " << s.slot;
    ThreadPool::Default().ParallelFor(hv, 1, [&](int64_t h0, int64_t h1) {
      std::vector<float> qn(dk), kn(dk), kv(dv), widened(bf16_state ? dk * dv : 0);
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t offset = s.slot * state.strides[0] + h * state.strides[1];
        float* S = bf16_state ? widened.data() : state.ptr<float>() + offset;  // [Dk, Dv]
        if (s.fresh) {
          std::fill_n(S, dk * dv, 0.0f);
        } else if (bf16_state) {
          for (int64_t i = 0; i < dk * dv; ++i) S[i] = ToFloat(state.ptr<bf16>()[offset + i]);
        }
        const float decay_rate = -std::exp(a_log.ptr<float>()[h]);
        const float bias = dt_bias.ptr<float>()[h];
        for (int64_t t = s.begin; t < s.end; ++t) {
          const float* qt = q.ptr<float>() + t * q.strides[0] + (h / group) * q.strides[1];
          const float* kt = k.ptr<float>() + t * k.strides[0] + (h / group) * k.strides[1];
          const float* vt = v.ptr<float>() + t * v.strides[0] + h * v.strides[1];
          double qss = 0, kss = 0;
          for (int64_t i = 0; i < dk; ++i) {
            qss += static_cast<double>(qt[i]) * qt[i];
            kss += static_cast<double>(kt[i]) * kt[i];
          }
          const float qinv = 1.0f / std::sqrt(static_cast<float>(qss) + 1e-6f) * scale;
          const float kinv = 1.0f / std::sqrt(static_cast<float>(kss) + 1e-6f);
          for (int64_t i = 0; i < dk; ++i) {
            qn[i] = qt[i] * qinv;
            kn[i] = kt[i] * kinv;
          }
          const float g = std::exp(decay_rate * Softplus(a.ptr<float>()[t * a.strides[0] + h] + bias));
          const float beta = 1.0f / (1.0f + std::exp(-b.ptr<float>()[t * b.strides[0] + h]));
          // S = g S; kv = S^T k; S += k (beta (v - kv))^T; out = S^T q.
          std::fill(kv.begin(), kv.end(), 0.0f);
          for (int64_t i = 0; i < dk; ++i) {
            float* row = S + i * dv;
            for (int64_t j = 0; j < dv; ++j) {
              row[j] *= g;
              kv[j] += row[j] * kn[i];
            }
          }
          for (int64_t j = 0; j < dv; ++j) kv[j] = beta * (vt[j] - kv[j]);
          float* o = out.ptr<float>() + t * out.strides[0] + h * out.strides[1];
          std::fill_n(o, dv, 0.0f);
          for (int64_t i = 0; i < dk; ++i) {
            float* row = S + i * dv;
            for (int64_t j = 0; j < dv; ++j) {
              row[j] += kn[i] * kv[j];
              o[j] += row[j] * qn[i];
            }
          }
        }
        if (bf16_state)
          for (int64_t i = 0; i < dk * dv; ++i) state.ptr<bf16>()[offset + i] = ToBf16(S[i]);
      }
    });
  }
}

void GatedRmsNorm(const TensorView& x, const TensorView& z, const TensorView& w, float eps, const TensorView& out) {
  const int64_t tokens = x.dim(0), heads = x.dim(1), d = x.dim(2);
  COROLLA_CHECK(z.dim(0) == tokens && z.dim(1) == heads && z.dim(2) == d && w.numel() == d);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const float* xp = x.ptr<float>() + t * x.strides[0] + h * x.strides[1];
      const float* zp = z.ptr<float>() + t * z.strides[0] + h * z.strides[1];
      float* op = out.ptr<float>() + t * out.strides[0] + h * out.strides[1];
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xp[i]) * xp[i];
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss / d) + eps);
      for (int64_t i = 0; i < d; ++i) op[i] = w.ptr<float>()[i] * (xp[i] * inv) * Silu(zp[i]);
    }
}

}  // namespace corolla::cpu
