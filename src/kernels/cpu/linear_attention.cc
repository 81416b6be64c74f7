// Gated DeltaNet on the CPU: causal conv1d with a rolling state, the gated delta rule (recurrent
// form for decode and short chunks, the reference every other kernel is checked against; chunked WY
// form through OpenBLAS for long prefill chunks, see linear_attention.h), the gated RMSNorm, and the
// sigmoid gates of gated attention and the shared expert. float32 math throughout. A bf16
// recurrent state is stored as bf16 and widened on read: each sequence's chunk starts from the
// widened state, runs in f32 and writes it back rounded to nearest even once at its end, as
// the CUDA kernel does (so decoding rounds after every token, one prefill chunk once).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/numeric.h"
#include "base/thread_pool.h"
#include "kernels/cpu/linear_attention.h"
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

namespace {

// The gated delta rule's inputs, seen from one value head.
struct DeltaRuleInputs {
  const TensorView &q, &k, &v, &a, &b, &out;
  const float *a_log, *dt_bias;
  int64_t dk, dv, group;  // group: value heads per q/k head
  float scale;            // Dk^-0.5
};

// Token t of value head h as both forms see it: q (L2-normalised, scaled) and k (L2-normalised)
// into qn, kn [Dk]; the log of its decay, g = -exp(A_log) softplus(a + dt_bias); beta.
void PrepareToken(const DeltaRuleInputs& in, int64_t h, int64_t t, float* qn, float* kn, float* log_decay,
                  float* beta) {
  const float* qt = in.q.ptr<float>() + t * in.q.strides[0] + (h / in.group) * in.q.strides[1];
  const float* kt = in.k.ptr<float>() + t * in.k.strides[0] + (h / in.group) * in.k.strides[1];
  double qss = 0, kss = 0;
  for (int64_t i = 0; i < in.dk; ++i) {
    qss += static_cast<double>(qt[i]) * qt[i];
    kss += static_cast<double>(kt[i]) * kt[i];
  }
  const float qinv = 1.0f / std::sqrt(static_cast<float>(qss) + 1e-6f) * in.scale;
  const float kinv = 1.0f / std::sqrt(static_cast<float>(kss) + 1e-6f);
  for (int64_t i = 0; i < in.dk; ++i) {
    qn[i] = qt[i] * qinv;
    kn[i] = kt[i] * kinv;
  }
  *log_decay = -std::exp(in.a_log[h]) * Softplus(in.a.ptr<float>()[t * in.a.strides[0] + h] + in.dt_bias[h]);
  *beta = 1.0f / (1.0f + std::exp(-in.b.ptr<float>()[t * in.b.strides[0] + h]));
}

// Per-thread buffers of both forms, sized for one head.
struct DeltaRuleScratch {
  DeltaRuleScratch(int64_t dk, int64_t dv)
      : q(kGatedDeltaChunkTokens * dk), k(kGatedDeltaChunkTokens * dk), rhs(kGatedDeltaChunkTokens * (dv + dk)),
        kk(kGatedDeltaChunkTokens * kGatedDeltaChunkTokens), qk(kGatedDeltaChunkTokens * kGatedDeltaChunkTokens),
        decay(kGatedDeltaChunkTokens * kGatedDeltaChunkTokens), kv(dv) {}
  std::vector<float> q, k, rhs, kk, qk, decay, kv;
  float log_decay[kGatedDeltaChunkTokens], beta[kGatedDeltaChunkTokens], gamma[kGatedDeltaChunkTokens];
};

// Tokens [begin, end) of value head h, one at a time, from and into S [Dk, Dv]:
// S = exp(g) S; kv = S^T k; S += k (beta (v - kv))^T; out = S^T q.
void RecurrentHead(const DeltaRuleInputs& in, int64_t h, int64_t begin, int64_t end, float* S,
                   DeltaRuleScratch& w) {
  const int64_t dk = in.dk, dv = in.dv;
  float* qn = w.q.data();
  float* kn = w.k.data();
  float* kv = w.kv.data();
  for (int64_t t = begin; t < end; ++t) {
    float log_decay, beta;
    PrepareToken(in, h, t, qn, kn, &log_decay, &beta);
    const float g = std::exp(log_decay);
    const float* vt = in.v.ptr<float>() + t * in.v.strides[0] + h * in.v.strides[1];
    std::fill_n(kv, dv, 0.0f);
    for (int64_t i = 0; i < dk; ++i) {
      float* row = S + i * dv;
      for (int64_t j = 0; j < dv; ++j) {
        row[j] *= g;
        kv[j] += row[j] * kn[i];
      }
    }
    for (int64_t j = 0; j < dv; ++j) kv[j] = beta * (vt[j] - kv[j]);
    float* o = in.out.ptr<float>() + t * in.out.strides[0] + h * in.out.strides[1];
    std::fill_n(o, dv, 0.0f);
    for (int64_t i = 0; i < dk; ++i) {
      float* row = S + i * dv;
      for (int64_t j = 0; j < dv; ++j) {
        row[j] += kn[i] * kv[j];
        o[j] += row[j] * qn[i];
      }
    }
  }
}

// The same tokens in chunks of n <= C: the WY (UT-transform) form of the Gated DeltaNet paper.
// Within a chunk starting from state S0, with G_t = g_1 + .. + g_t and D[t][i] = exp(G_t - G_i):
//   S_t = exp(G_t) S0 + sum_{i<=t} D[t][i] k_i delta_i^T,  delta_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t),
// which unrolls to the unit lower-triangular system (I + A) delta = beta V - diag(beta exp(G)) K S0,
// A[t][i] = beta_t D[t][i] (k_t . k_i) for i < t. Forward substitution gives U = (I+A)^-1 beta V
// and W = (I+A)^-1 diag(beta exp(G)) K, so delta = U - W S0, and
//   O = diag(exp(G)) Q S0 + (D o Q K^T, lower incl. diagonal) delta,
//   S_n = exp(G_n) S0 + (diag(D[n][.]) K)^T delta.
// Every decay is exp of a sum of log decays over the tokens it spans (accumulated in double), never a
// ratio of cumulative products: nothing overflows, and a zero decay (g = -inf) stays an exact zero.
void ChunkedHead(const DeltaRuleInputs& in, int64_t h, int64_t begin, int64_t end, float* S, DeltaRuleScratch& w) {
  const int64_t dk = in.dk, dv = in.dv, ldr = dv + dk;  // rhs [n, Dv + Dk]: U | W
  const int64_t ldo = in.out.strides[0];
  for (int64_t c0 = begin; c0 < end; c0 += kGatedDeltaChunkTokens) {
    const int64_t n = std::min(kGatedDeltaChunkTokens, end - c0);
    float *q = w.q.data(), *k = w.k.data(), *rhs = w.rhs.data();  // q, k [n, Dk]
    float *kk = w.kk.data(), *qk = w.qk.data(), *decay = w.decay.data();  // [n, n]
    for (int64_t t = 0; t < n; ++t) PrepareToken(in, h, c0 + t, q + t * dk, k + t * dk, &w.log_decay[t], &w.beta[t]);
    // decay[t][i] = D[t][i] (i <= t); gamma[t] = exp(G_t).
    for (int64_t i = 0; i < n; ++i) {
      double sum = 0;
      decay[i * n + i] = 1.0f;
      for (int64_t t = i + 1; t < n; ++t) {
        sum += w.log_decay[t];
        decay[t * n + i] = static_cast<float>(std::exp(sum));
      }
    }
    double sum = 0;
    for (int64_t t = 0; t < n; ++t) {
      sum += w.log_decay[t];
      w.gamma[t] = static_cast<float>(std::exp(sum));
    }
    // kk = K K^T, qk = Q K^T  [n, n]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, dk, 1.0f, k, dk, k, dk, 0.0f, kk, n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, dk, 1.0f, q, dk, k, dk, 0.0f, qk, n);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < t; ++i) kk[t * n + i] *= w.beta[t] * decay[t * n + i];  // A; strsm reads only this
      for (int64_t i = 0; i <= t; ++i) qk[t * n + i] *= decay[t * n + i];
      std::fill(qk + t * n + t + 1, qk + (t + 1) * n, 0.0f);
      const float* vt = in.v.ptr<float>() + (c0 + t) * in.v.strides[0] + h * in.v.strides[1];
      float* r = rhs + t * ldr;
      for (int64_t j = 0; j < dv; ++j) r[j] = w.beta[t] * vt[j];
      for (int64_t i = 0; i < dk; ++i) r[dv + i] = w.beta[t] * w.gamma[t] * k[t * dk + i];
    }
    // [U | W] = (I + A)^-1 rhs, then delta = U - W S0 in U's columns.
    cblas_strsm(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasUnit, n, ldr, 1.0f, kk, n, rhs, ldr);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, dv, dk, -1.0f, rhs + dv, ldr, S, dv, 1.0f, rhs, ldr);
    // out [n, Dv] = diag(gamma) Q S0 + qk delta
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < dk; ++i) q[t * dk + i] *= w.gamma[t];
    float* o = in.out.ptr<float>() + c0 * ldo + h * in.out.strides[1];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, dv, dk, 1.0f, q, dk, S, dv, 0.0f, o, ldo);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, dv, n, 1.0f, qk, n, rhs, ldr, 1.0f, o, ldo);
    // S = gamma_n S0 + (diag(D[n][.]) K)^T delta
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < dk; ++i) k[t * dk + i] *= decay[(n - 1) * n + t];
    const float gamma_n = w.gamma[n - 1];
    for (int64_t i = 0; i < dk * dv; ++i) S[i] *= gamma_n;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dk, dv, n, 1.0f, k, dk, rhs, ldr, 1.0f, S, dv);
  }
}

}  // namespace

void GatedDeltaRule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& a,
                    const TensorView& b, const TensorView& a_log, const TensorView& dt_bias,
                    const TensorView& state, const TensorView& state_slots, const AttentionBatch& batch,
                    const TensorView& out) {
  GatedDeltaRule(q, k, v, a, b, a_log, dt_bias, state, state_slots, batch, out, kGatedDeltaChunkedMinTokens);
}

void GatedDeltaRule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& a,
                    const TensorView& b, const TensorView& a_log, const TensorView& dt_bias,
                    const TensorView& state, const TensorView& state_slots, const AttentionBatch& batch,
                    const TensorView& out, int64_t chunked_min_tokens) {
  const int64_t hk = q.dim(1), dk = q.dim(2), hv = v.dim(1), dv = v.dim(2);
  COROLLA_CHECK(hv % hk == 0 && k.dim(1) == hk && k.dim(2) == dk && state.dim(1) == hv && state.dim(2) == dk &&
                state.dim(3) == dv && a.dim(1) == hv && b.dim(1) == hv && out.dim(1) == hv && out.dim(2) == dv)
      << "gated delta rule q " << q.ToString() << " v " << v.ToString() << " state " << state.ToString();
  const bool bf16_state = state.dtype == DType::kBF16;
  COROLLA_CHECK((state.dtype == DType::kF32 || bf16_state) && state.strides[2] == dv && state.strides[3] == 1)
      << "gated delta rule state: expected f32 or bf16 with contiguous [Dk, Dv] heads, got " << state.ToString();
  const DeltaRuleInputs in{q, k, v, a, b, out, a_log.ptr<float>(), dt_bias.ptr<float>(), dk, dv, hv / hk,
                           1.0f / std::sqrt(static_cast<float>(dk))};
  for (const SeqRange& s : Sequences(batch, state_slots)) {
    COROLLA_CHECK(s.slot >= 0 && s.slot < state.dim(0)) << "state slot " << s.slot;
    const bool chunked = s.end - s.begin >= chunked_min_tokens;
    // The chunked form's GEMMs run on OpenBLAS's own threads; spreading its heads over the pool
    // as well oversubscribes the cores (25% slower on 2 cores, BENCHMARKS.md), so they run in turn.
    const int64_t heads_per_task = chunked ? hv : 1;
    ThreadPool::Default().ParallelFor(hv, heads_per_task, [&](int64_t h0, int64_t h1) {
      DeltaRuleScratch scratch(dk, dv);
      std::vector<float> widened(bf16_state ? dk * dv : 0);
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t offset = s.slot * state.strides[0] + h * state.strides[1];
        float* S = bf16_state ? widened.data() : state.ptr<float>() + offset;  // [Dk, Dv]
        if (s.fresh) {
          std::fill_n(S, dk * dv, 0.0f);
        } else if (bf16_state) {
          for (int64_t i = 0; i < dk * dv; ++i) S[i] = ToFloat(state.ptr<bf16>()[offset + i]);
        }
        if (chunked) {
          ChunkedHead(in, h, s.begin, s.end, S, scratch);
        } else {
          RecurrentHead(in, h, s.begin, s.end, S, scratch);
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
