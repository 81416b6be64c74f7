// Gated DeltaNet on the GPU (Qwen3.5 / Qwen3-Next hybrids) and the sigmoid gates of gated
// attention: SigmoidMul, CausalConv1d (conv + SiLU + rolling-state update in one kernel, prefill
// chunks and decode alike), the gated delta rule in its recurrent form, GatedRmsNorm.
// Activations bf16, all math f32; the conv state is f32, the recurrent state f32 or bf16 (read
// once per chunk into registers, written back rounded once at its end: a decode step rounds it
// once). The CPU twins are kernels/cpu/linear_attention.cc.
//
// Recurrent delta rule: a value head's state S [Dk, Dv] splits by columns (each column j of S
// evolves alone given q, k, beta, g), so one CTA owns (sequence, value head, 32 columns) and
// keeps that slice in registers across the whole chunk: lane = column, warp w = rows
// [w Dk/4, (w+1) Dk/4). Per token: three barriers (norms of q/k, S^T k, S^T q). Sequences of
// at least Tuning().gated_delta_chunked_min_tokens new tokens take the chunked WY/UT form on
// tensor cores instead (gated_delta_chunked.cu) where it covers the layout.
#include <algorithm>
#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gated_delta.h"
#include "kernels/cuda/ops.h"

namespace corolla::cuda {
namespace {

__device__ __forceinline__ float SiluF(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float SoftplusF(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

void CheckBf16Rows(const TensorView& t, const char* what) {
  COROLLA_CHECK(t.dtype == DType::kBF16 && t.device == Device::kCuda && t.strides[t.rank() - 1] == 1)
      << what << ": expected a bf16 cuda view with a contiguous last dim, got " << t.ToString();
}
void CheckF32Dev(const TensorView& t, const char* what) {
  COROLLA_CHECK(t.dtype == DType::kF32 && t.device == Device::kCuda && t.is_contiguous())
      << what << ": expected a contiguous f32 cuda tensor, got " << t.ToString();
}
void CheckI32Dev(const TensorView& t, const char* what) {
  COROLLA_CHECK(t.dtype == DType::kI32 && t.device == Device::kCuda && t.is_contiguous())
      << what << ": expected contiguous i32 cuda view, got " << t.ToString();
}
int64_t Stride0(const TensorView& t) { return t.dim(0) > 1 ? t.strides[0] : 0; }

// ---- SigmoidMul -------------------------------------------------------------------------
struct SigmoidMulParams {
  bf16_t* x;
  int64_t x_stride;
  const bf16_t* gate;
  int64_t gate_stride;
  int64_t rows;
  int cols, width;  // width: columns per gate column
};

__global__ void SigmoidMulKernel(const __grid_constant__ SigmoidMulParams p) {
  const int64_t n = p.rows * p.cols;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / p.cols;
    const int c = static_cast<int>(idx % p.cols);
    bf16_t* x = p.x + r * p.x_stride + c;
    const float g = __bfloat162float(p.gate[r * p.gate_stride + c / p.width]);
    *x = __float2bfloat16(__bfloat162float(*x) * (1.0f / (1.0f + expf(-g))));
  }
}

// ---- CausalConv1d -----------------------------------------------------------------------
struct ConvParams {
  const bf16_t* x;
  int64_t x_stride;
  const bf16_t* weight;  // [C, K]
  float* state;          // [slots, C, K-1]
  int64_t num_slots;
  const int32_t* slots;  // [B]
  const int32_t* query_start;
  const int32_t* seq_lens;
  bf16_t* out;
  int64_t out_stride;
  int channels;
  int tile;  // tokens per thread
};

// Thread (channel c, token tile, sequence b). The first tile of a sequence also reads the old
// state and writes the new one (from x alone when the chunk holds >= K-1 tokens), so no other
// CTA reads the state it rewrites.
template <int kK>
__global__ void CausalConv1dKernel(const __grid_constant__ ConvParams p) {
  constexpr int kHist = kK - 1;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int b = blockIdx.z;
  if (c >= p.channels) return;
  const int begin = p.query_start[b], end = p.query_start[b + 1], len = end - begin;
  const int t0 = begin + blockIdx.y * p.tile;
  if (t0 >= end) return;
  const int t1 = min(end, t0 + p.tile);
  const bool fresh = p.seq_lens[b] - len == 0;
  const int32_t slot = p.slots[b];
  float* st = (slot >= 0 && slot < p.num_slots) ? p.state + (static_cast<int64_t>(slot) * p.channels + c) * kHist : nullptr;
  float w[kK];
#pragma unroll
  for (int j = 0; j < kK; ++j) w[j] = __bfloat162float(p.weight[static_cast<int64_t>(c) * kK + j]);
  // win[0..kHist-1]: inputs t-K+1 .. t-1 of the first token of the tile.
  float win[kK];
#pragma unroll
  for (int j = 0; j < kHist; ++j) {
    const int t = t0 - kHist + j;
    float v = 0.0f;
    if (t >= begin) {
      v = __bfloat162float(p.x[static_cast<int64_t>(t) * p.x_stride + c]);
    } else if (!fresh && st != nullptr) {
      v = st[kHist - (begin - t)];  // the state holds inputs begin-K+1 .. begin-1
    }
    win[j] = v;
  }
  if (blockIdx.y == 0 && st != nullptr) {
    // New state: the last K-1 inputs up to end-1 (old state entries where the chunk is short).
    float next[kHist];
#pragma unroll
    for (int j = 0; j < kHist; ++j) {
      const int t = end - kHist + j;
      float v = 0.0f;
      if (t >= begin) v = __bfloat162float(p.x[static_cast<int64_t>(t) * p.x_stride + c]);
      else if (!fresh) v = st[kHist - (begin - t)];
      next[j] = v;
    }
#pragma unroll
    for (int j = 0; j < kHist; ++j) st[j] = next[j];
  }
  for (int t = t0; t < t1; ++t) {
    win[kHist] = __bfloat162float(p.x[static_cast<int64_t>(t) * p.x_stride + c]);
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kK; ++j) acc += w[j] * win[j];
    p.out[static_cast<int64_t>(t) * p.out_stride + c] = __float2bfloat16(SiluF(acc));
#pragma unroll
    for (int j = 0; j < kHist; ++j) win[j] = win[j + 1];
  }
}

// ---- gated delta rule (recurrent) -------------------------------------------------------
constexpr int kDeltaWarps = 4;
constexpr int kDeltaCols = 32;

__device__ __forceinline__ float StateLoad(const float* p) { return *p; }
__device__ __forceinline__ float StateLoad(const bf16_t* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void StateStore(float* p, float v) { *p = v; }
__device__ __forceinline__ void StateStore(bf16_t* p, float v) { *p = __float2bfloat16(v); }  // nearest even

template <int kDk, typename StateT>
__global__ void __launch_bounds__(kDeltaWarps * 32) GatedDeltaRuleKernel(const __grid_constant__ DeltaRuleParams p) {
  constexpr int kRows = kDk / kDeltaWarps;  // state rows per thread
  __shared__ float sq[kDk], sk[kDk];
  __shared__ float red_norm[2][kDeltaWarps];
  __shared__ float red_kv[kDeltaWarps][kDeltaCols], red_o[kDeltaWarps][kDeltaCols];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = blockIdx.y, seq = blockIdx.z;
  const int col = blockIdx.x * kDeltaCols + lane;
  const bool col_ok = col < p.dv;
  const int begin = p.query_start[seq], end = p.query_start[seq + 1];
  if (end - begin < p.min_tokens || end - begin >= p.max_tokens) return;  // the chunked kernel's sequence
  const bool fresh = p.seq_lens[seq] - (end - begin) == 0;
  const int32_t slot = p.slots[seq];
  if (slot < 0 || slot >= p.num_slots) return;  // whole CTA: no barrier is skipped by part of it
  StateT* S = static_cast<StateT*>(p.state) + ((static_cast<int64_t>(slot) * p.hv + h) * kDk) * p.dv;
  const int row0 = warp * kRows;
  float s[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    s[r] = (!fresh && col_ok) ? StateLoad(S + static_cast<int64_t>(row0 + r) * p.dv + col) : 0.0f;
  const float decay_rate = -expf(p.a_log[h]);
  const float bias = p.dt_bias[h];
  const int kh = h / p.group;
  for (int t = begin; t < end; ++t) {
    // q, k of the token's key head -> shared (f32), with their sums of squares.
    const bf16_t* qt = p.q + static_cast<int64_t>(t) * p.q_token_stride + kh * p.q_head_stride;
    const bf16_t* kt = p.k + static_cast<int64_t>(t) * p.k_token_stride + kh * p.k_head_stride;
    float qss = 0.0f, kss = 0.0f;
    for (int i = threadIdx.x; i < kDk; i += blockDim.x) {
      const float qv = __bfloat162float(qt[i]), kv = __bfloat162float(kt[i]);
      sq[i] = qv;
      sk[i] = kv;
      qss += qv * qv;
      kss += kv * kv;
    }
    qss = WarpSum(qss);
    kss = WarpSum(kss);
    if (lane == 0) {
      red_norm[0][warp] = qss;
      red_norm[1][warp] = kss;
    }
    const float vj = col_ok ? __bfloat162float(p.v[static_cast<int64_t>(t) * p.v_token_stride + h * p.v_head_stride + col]) : 0.0f;
    const float g = expf(decay_rate * SoftplusF(__bfloat162float(p.a[static_cast<int64_t>(t) * p.a_stride + h]) + bias));
    const float beta = 1.0f / (1.0f + expf(-__bfloat162float(p.b[static_cast<int64_t>(t) * p.b_stride + h])));
    __syncthreads();
    qss = 0.0f;
    kss = 0.0f;
#pragma unroll
    for (int w = 0; w < kDeltaWarps; ++w) {
      qss += red_norm[0][w];
      kss += red_norm[1][w];
    }
    const float qinv = rsqrtf(qss + 1e-6f) * p.scale, kinv = rsqrtf(kss + 1e-6f);
    // S = g S; kv = S^T k.
    float part = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      s[r] *= g;
      part += s[r] * (sk[row0 + r] * kinv);
    }
    red_kv[warp][lane] = part;
    __syncthreads();
    float kv = 0.0f;
#pragma unroll
    for (int w = 0; w < kDeltaWarps; ++w) kv += red_kv[w][lane];
    const float delta = beta * (vj - kv);
    // S += k delta^T; out = S^T q.
    part = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      s[r] += (sk[row0 + r] * kinv) * delta;
      part += s[r] * (sq[row0 + r] * qinv);
    }
    red_o[warp][lane] = part;
    __syncthreads();
    if (warp == 0 && col_ok) {
      float o = 0.0f;
#pragma unroll
      for (int w = 0; w < kDeltaWarps; ++w) o += red_o[w][lane];
      p.out[static_cast<int64_t>(t) * p.out_token_stride + h * p.out_head_stride + col] = __float2bfloat16(o);
    }
  }
  if (col_ok) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) StateStore(S + static_cast<int64_t>(row0 + r) * p.dv + col, s[r]);
  }
}

// ---- GatedRmsNorm -----------------------------------------------------------------------
struct GatedNormParams {
  const bf16_t* x;
  int64_t x_token_stride, x_head_stride;
  const bf16_t* z;
  int64_t z_token_stride, z_head_stride;
  const bf16_t* w;
  bf16_t* out;
  int64_t out_token_stride, out_head_stride;
  int64_t rows;  // tokens * heads
  int heads, d;
  float eps;
};

// One warp per (token, head).
__global__ void GatedRmsNormKernel(const __grid_constant__ GatedNormParams p) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.rows) return;
  const int64_t t = row / p.heads, h = row % p.heads;
  const bf16_t* x = p.x + t * p.x_token_stride + h * p.x_head_stride;
  const bf16_t* z = p.z + t * p.z_token_stride + h * p.z_head_stride;
  bf16_t* o = p.out + t * p.out_token_stride + h * p.out_head_stride;
  float ss = 0.0f;
  for (int i = lane; i < p.d; i += 32) {
    const float v = __bfloat162float(x[i]);
    ss += v * v;
  }
  ss = WarpSum(ss);
  const float inv = rsqrtf(ss / p.d + p.eps);
  for (int i = lane; i < p.d; i += 32)
    o[i] = __float2bfloat16(__bfloat162float(p.w[i]) * (__bfloat162float(x[i]) * inv) * SiluF(__bfloat162float(z[i])));
}

int GridFor(int64_t n, int threads) {
  return static_cast<int>(std::clamp<int64_t>((n + threads - 1) / threads, 1, 132 * 16));
}

}  // namespace

void SigmoidMul(const TensorView& x, const TensorView& gate, cudaStream_t s) {
  CheckBf16Rows(x, "sigmoid_mul x");
  CheckBf16Rows(gate, "sigmoid_mul gate");
  COROLLA_CHECK(x.rank() == 2 && gate.rank() == 2 && gate.dim(0) == x.dim(0) && gate.dim(1) > 0 &&
                x.dim(1) % gate.dim(1) == 0)
      << "sigmoid_mul x " << x.ToString() << " gate " << gate.ToString();
  if (x.numel() == 0) return;
  SigmoidMulParams p{x.ptr<bf16_t>(), Stride0(x), gate.ptr<bf16_t>(), Stride0(gate), x.dim(0),
                     static_cast<int>(x.dim(1)), static_cast<int>(x.dim(1) / gate.dim(1))};
  SigmoidMulKernel<<<GridFor(x.numel(), 256), 256, 0, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

void CausalConv1d(const TensorView& x, const TensorView& weight, const TensorView& conv_state,
                  const TensorView& state_slots, const AttentionBatch& batch, const TensorView& out,
                  cudaStream_t s) {
  CheckBf16Rows(x, "conv1d x");
  CheckBf16Rows(out, "conv1d out");
  COROLLA_CHECK(weight.dtype == DType::kBF16 && weight.is_contiguous()) << "conv1d weight " << weight.ToString();
  CheckF32Dev(conv_state, "conv1d state");
  CheckI32Dev(state_slots, "conv1d state_slots");
  CheckI32Dev(batch.query_start, "query_start");
  CheckI32Dev(batch.seq_lens, "seq_lens");
  const int64_t tokens = x.dim(0), channels = x.dim(1), kernel = weight.dim(1);
  const int64_t num_seqs = batch.seq_lens.numel();
  COROLLA_CHECK(x.rank() == 2 && out.rank() == 2 && out.dim(0) == tokens && out.dim(1) == channels &&
                weight.rank() == 2 && weight.dim(0) == channels && conv_state.rank() == 3 &&
                conv_state.dim(1) == channels && conv_state.dim(2) == kernel - 1 &&
                state_slots.numel() == num_seqs)
      << "conv1d x " << x.ToString() << " weight " << weight.ToString() << " state " << conv_state.ToString()
      << " out " << out.ToString();
  if (tokens == 0 || num_seqs == 0) return;
  const int max_q = batch.max_q_len > 0 ? batch.max_q_len : static_cast<int>(tokens);
  constexpr int kTile = 64;
  ConvParams p{x.ptr<bf16_t>(), Stride0(x), weight.ptr<bf16_t>(), conv_state.ptr<float>(), conv_state.dim(0),
               state_slots.ptr<int32_t>(), batch.query_start.ptr<int32_t>(), batch.seq_lens.ptr<int32_t>(),
               out.ptr<bf16_t>(), Stride0(out), static_cast<int>(channels), kTile};
  const int threads = 128;
  dim3 grid(CeilDiv(channels, threads), CeilDiv(max_q, kTile), static_cast<unsigned>(num_seqs));
  switch (kernel) {
    case 2: CausalConv1dKernel<2><<<grid, threads, 0, s>>>(p); break;
    case 3: CausalConv1dKernel<3><<<grid, threads, 0, s>>>(p); break;
    case 4: CausalConv1dKernel<4><<<grid, threads, 0, s>>>(p); break;
    case 5: CausalConv1dKernel<5><<<grid, threads, 0, s>>>(p); break;
    default: COROLLA_CHECK(false) << "conv1d: kernel size " << kernel << " is not in the supported table (2-5)";
  }
  COROLLA_CUDA_CHECK_LAUNCH();
}

void GatedDeltaRule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& a,
                    const TensorView& b, const TensorView& a_log, const TensorView& dt_bias,
                    const TensorView& state, const TensorView& state_slots, const AttentionBatch& batch,
                    const TensorView& out, cudaStream_t s) {
  for (const TensorView* t : {&q, &k, &v, &a, &b, &out}) CheckBf16Rows(*t, "gated delta rule input/output");
  CheckF32Dev(a_log, "A_log");
  CheckF32Dev(dt_bias, "dt_bias");
  COROLLA_CHECK((state.dtype == DType::kF32 || state.dtype == DType::kBF16) && state.device == Device::kCuda &&
                state.is_contiguous())
      << "recurrent state: expected a contiguous f32 or bf16 cuda tensor, got " << state.ToString();
  CheckI32Dev(state_slots, "state_slots");
  CheckI32Dev(batch.query_start, "query_start");
  CheckI32Dev(batch.seq_lens, "seq_lens");
  const int64_t tokens = q.dim(0), hk = q.dim(1), dk = q.dim(2), hv = v.dim(1), dv = v.dim(2);
  const int64_t num_seqs = batch.seq_lens.numel();
  COROLLA_CHECK(q.rank() == 3 && k.shape == q.shape && v.rank() == 3 && v.dim(0) == tokens && hv % hk == 0 &&
                a.rank() == 2 && b.rank() == 2 && a.dim(1) == hv && b.dim(1) == hv && a.dim(0) == tokens &&
                b.dim(0) == tokens && out.rank() == 3 && out.dim(0) == tokens && out.dim(1) == hv &&
                out.dim(2) == dv && state.rank() == 4 && state.dim(1) == hv && state.dim(2) == dk &&
                state.dim(3) == dv && a_log.numel() == hv && dt_bias.numel() == hv &&
                state_slots.numel() == num_seqs)
      << "gated delta rule q " << q.ToString() << " v " << v.ToString() << " state " << state.ToString()
      << " out " << out.ToString();
  if (tokens == 0 || num_seqs == 0) return;
  DeltaRuleParams p{q.ptr<bf16_t>(), q.strides[0], q.strides[1], k.ptr<bf16_t>(), k.strides[0], k.strides[1],
                    v.ptr<bf16_t>(), v.strides[0], v.strides[1], a.ptr<bf16_t>(), Stride0(a),
                    b.ptr<bf16_t>(), Stride0(b), a_log.ptr<float>(), dt_bias.ptr<float>(), state.data,
                    state.dim(0), state_slots.ptr<int32_t>(), batch.query_start.ptr<int32_t>(),
                    batch.seq_lens.ptr<int32_t>(), out.ptr<bf16_t>(), out.strides[0], out.strides[1],
                    static_cast<int>(hv), static_cast<int>(hv / hk), static_cast<int>(dv),
                    1.0f / std::sqrt(static_cast<float>(dk)), 0, INT_MAX};
  const bool bf16_state = state.dtype == DType::kBF16;
  // Sequences of >= `threshold` new tokens go to the chunked kernel (its CTAs of shorter ones
  // exit at once, as the recurrent kernel's of longer ones do). The host knows only the longest
  // chunk (max_q_len, or the batch size when unset; upper bounds under graph replay), so the
  // recurrent kernel runs too whenever the chunked one does.
  const int64_t threshold = std::max<int64_t>(1, Tuning().gated_delta_chunked_min_tokens);
  const int64_t longest = batch.max_q_len > 0 ? std::min<int64_t>(batch.max_q_len, tokens) : tokens;
  const bool chunked = longest >= threshold && GatedDeltaChunkedSupports(static_cast<int>(dk), p);
  if (chunked) {
    DeltaRuleParams pc = p;
    pc.min_tokens = static_cast<int>(std::min<int64_t>(threshold, INT_MAX));
    LaunchGatedDeltaChunked(pc, static_cast<int>(dk), bf16_state, static_cast<int>(num_seqs), s);
    p.max_tokens = pc.min_tokens;
  }
  dim3 grid(CeilDiv(dv, kDeltaCols), static_cast<unsigned>(hv), static_cast<unsigned>(num_seqs));
  const bool ok = DispatchHeadDim(static_cast<int>(dk), [&](auto d) {
    if (bf16_state)
      GatedDeltaRuleKernel<decltype(d)::value, bf16_t><<<grid, kDeltaWarps * 32, 0, s>>>(p);
    else
      GatedDeltaRuleKernel<decltype(d)::value, float><<<grid, kDeltaWarps * 32, 0, s>>>(p);
  });
  COROLLA_CHECK(ok) << "gated delta rule: key head dim " << dk << " is not in the supported table (32, 64, 128, 256)";
  COROLLA_CUDA_CHECK_LAUNCH();
}

void GatedRmsNorm(const TensorView& x, const TensorView& z, const TensorView& w, float eps, const TensorView& out,
                  cudaStream_t s) {
  CheckBf16Rows(x, "gated rmsnorm x");
  CheckBf16Rows(z, "gated rmsnorm z");
  CheckBf16Rows(out, "gated rmsnorm out");
  COROLLA_CHECK(w.dtype == DType::kBF16 && w.is_contiguous()) << "gated rmsnorm w " << w.ToString();
  COROLLA_CHECK(x.rank() == 3 && z.shape == x.shape && out.shape == x.shape && w.numel() == x.dim(2))
      << "gated rmsnorm x " << x.ToString() << " z " << z.ToString() << " out " << out.ToString();
  const int64_t rows = x.dim(0) * x.dim(1);
  if (rows == 0) return;
  GatedNormParams p{x.ptr<bf16_t>(), x.strides[0], x.strides[1], z.ptr<bf16_t>(), z.strides[0], z.strides[1],
                    w.ptr<bf16_t>(), out.ptr<bf16_t>(), out.strides[0], out.strides[1], rows,
                    static_cast<int>(x.dim(1)), static_cast<int>(x.dim(2)), eps};
  GatedRmsNormKernel<<<CeilDiv(rows * 32, 256), 256, 0, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

}  // namespace corolla::cuda
