// Row gathers (embedding, logits rows), RMSNorm with fused residual add, per-head RMSNorm,
// neox RoPE, SiLU-mul, add and the paged KV write. bf16 in/out, fp32 math. Rows may be strided
// (innermost dim contiguous); 16-byte accesses whenever every row is 16-byte aligned.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/timeline.cuh"
#include "kernels/cuda/timeline.h"

namespace corolla::cuda {
namespace {

constexpr int kThreads = 256;

void CheckBf16(const TensorView& t, const char* what) {
  COROLLA_CHECK(t.dtype == DType::kBF16 && t.device == Device::kCuda &&
                (t.rank() == 0 || t.strides[t.rank() - 1] == 1 || t.dim(-1) == 1))
      << what << ": expected a bf16 cuda view with contiguous rows, got " << t.ToString();
}
void CheckI32(const TensorView& t, const char* what) {
  COROLLA_CHECK(t.dtype == DType::kI32 && t.device == Device::kCuda && t.is_contiguous())
      << what << ": expected contiguous i32 cuda view, got " << t.ToString();
}
int64_t RowStride(const TensorView& t) { return t.dim(0) > 1 ? t.strides[0] : t.numel(); }

// ---- gather rows ------------------------------------------------------------------------
struct GatherParams {
  const bf16_t* src;
  int64_t src_stride;
  int64_t num_src_rows;
  const int32_t* rows;
  bf16_t* dst;
  int64_t dst_stride;
  int cols;
};

template <bool kVec>
__global__ void GatherRowsKernel(const __grid_constant__ GatherParams p) {
  const int64_t out_row = blockIdx.x;
  const int32_t r = p.rows[out_row];
  bf16_t* dst = p.dst + out_row * p.dst_stride;
  if (r < 0 || r >= p.num_src_rows) {  // invalid id: make it visible rather than read wild memory
    for (int c = threadIdx.x; c < p.cols; c += blockDim.x) dst[c] = __float2bfloat16(NAN);
    return;
  }
  const bf16_t* src = p.src + r * p.src_stride;
  if constexpr (kVec) {
    for (int c = threadIdx.x; c < p.cols / 8; c += blockDim.x)
      reinterpret_cast<uint4*>(dst)[c] = reinterpret_cast<const uint4*>(src)[c];
  } else {
    for (int c = threadIdx.x; c < p.cols; c += blockDim.x) dst[c] = src[c];
  }
}

// ---- RMSNorm ----------------------------------------------------------------------------
struct RmsNormParams {
  const bf16_t* x;
  int64_t x_stride;
  const void* w;
  bool w_f32;
  bf16_t* out;
  int64_t out_stride;
  bf16_t* residual;  // null: plain norm
  int64_t residual_stride;
  int cols;
  float eps;
  bool early_trigger;  // Tuning().pdl_early_trigger && rmsnorm_early_trigger
  uint64_t* timeline = nullptr;  // timeline.h
};

// Norm weights are bf16, or f32 where bf16 would round them (Qwen3.5's zero-centred norms are
// stored as 1 + w, which bf16 quantises to 2^-8: enough to move that model's logits by 1e-1).
struct NormWeight {
  const void* ptr;
  bool f32;
  __device__ float At(int64_t i) const {
    return f32 ? static_cast<const float*>(ptr)[i] : __bfloat162float(static_cast<const bf16_t*>(ptr)[i]);
  }
  // Elements [8 v, 8 v + 8).
  __device__ void Load8(int64_t v, float w[8]) const {
    if (f32) {
      const float4* q = reinterpret_cast<const float4*>(ptr) + 2 * v;
      float4 lo = q[0], hi = q[1];
      w[0] = lo.x; w[1] = lo.y; w[2] = lo.z; w[3] = lo.w;
      w[4] = hi.x; w[5] = hi.y; w[6] = hi.z; w[7] = hi.w;
    } else {
      Unpack8(reinterpret_cast<const Bf16x8*>(ptr)[v], w);
    }
  }
};

template <bool kVec>
__global__ void RmsNormKernel(const __grid_constant__ RmsNormParams p) {
  // Launched with programmatic dependent launch (pdl.cuh). The early trigger is safe: the next
  // kernel's own wait still covers this whole grid, which cannot end before its wait below.
  TimelineScope tl(p.timeline);
  const NormWeight nw{p.w, p.w_f32};
  // The norm weights of this thread's first chunk (a decode row's only one) are weights: loaded
  // before the wait, off the critical path.
  float w_first[8];
  const bool first = kVec && threadIdx.x < p.cols / 8;
  if (first) nw.Load8(threadIdx.x, w_first);
  if (p.early_trigger) TriggerDependents();
  GridDependencyWait();
  tl.Waited();
  if (!p.early_trigger) TriggerDependents();
  const int64_t row = blockIdx.x;
  const bf16_t* x = p.x + row * p.x_stride;
  bf16_t* res = p.residual ? p.residual + row * p.residual_stride : nullptr;
  bf16_t* out = p.out + row * p.out_stride;
  // Pass 1: residual += x (stored as bf16), sum of squares of the normed input in fp32.
  float ss = 0.0f;
  if constexpr (kVec) {
    for (int c = threadIdx.x; c < p.cols / 8; c += blockDim.x) {
      float a[8];
      Unpack8(reinterpret_cast<const Bf16x8*>(x)[c], a);
      if (res) {
        float b[8];
        Unpack8(reinterpret_cast<const Bf16x8*>(res)[c], b);
#pragma unroll
        for (int i = 0; i < 8; ++i) a[i] += b[i];
        Bf16x8 packed = Pack8(a);
        Store8(res + 8 * c, packed);
        Unpack8(packed, a);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += a[i] * a[i];
    }
  } else {
    for (int c = threadIdx.x; c < p.cols; c += blockDim.x) {
      float a = __bfloat162float(x[c]);
      if (res) {
        bf16_t s = __float2bfloat16(a + __bfloat162float(res[c]));
        res[c] = s;
        a = __bfloat162float(s);
      }
      ss += a * a;
    }
  }
  ss = BlockSum(ss);
  const float inv = rsqrtf(ss / p.cols + p.eps);
  // Pass 2: the same thread re-reads what it wrote (or x), so no barrier is needed.
  const bf16_t* src = res ? res : x;
  if constexpr (kVec) {
    for (int c = threadIdx.x; c < p.cols / 8; c += blockDim.x) {
      float a[8], w[8];
      Unpack8(reinterpret_cast<const Bf16x8*>(src)[c], a);
      if (c == threadIdx.x && first) {
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = w_first[i];
      } else {
        nw.Load8(c, w);
      }
      Store8(out + 8 * c, NormScale8(w, a, inv));
    }
  } else {
    for (int c = threadIdx.x; c < p.cols; c += blockDim.x)
      out[c] = __float2bfloat16(nw.At(c) * (__bfloat162float(src[c]) * inv));
  }
}

// ---- per-head RMSNorm -------------------------------------------------------------------
struct HeadNormParams {
  bf16_t* x;
  int64_t token_stride;
  int64_t head_stride;
  const void* w;
  bool w_f32;
  int64_t num_heads_total;  // tokens * heads
  int heads;
  int head_dim;
  float eps;
};

// kD / 8 threads per head (one 16-byte vector each), 32 / (kD / 8) heads per warp.
template <int kD>
__global__ void HeadRmsNormKernel(const __grid_constant__ HeadNormParams p) {
  constexpr int kTpH = kD / 8;
  const int64_t g = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kTpH;
  const int sub = threadIdx.x % kTpH;
  const bool active = g < p.num_heads_total;
  float a[8] = {};
  bf16_t* ptr = nullptr;
  if (active) {
    const int64_t t = g / p.heads, h = g % p.heads;
    ptr = p.x + t * p.token_stride + h * p.head_stride + sub * 8;
    Unpack8(*reinterpret_cast<const Bf16x8*>(ptr), a);
  }
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) ss += a[i] * a[i];
  ss = WarpSum<kTpH>(ss);
  if (!active) return;
  const float inv = rsqrtf(ss / kD + p.eps);
  float w[8];
  NormWeight{p.w, p.w_f32}.Load8(sub, w);
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = w[i] * (a[i] * inv);
  Store8(ptr, Pack8(a));
}

// Any head dim: one warp per head.
__global__ void HeadRmsNormGenericKernel(const __grid_constant__ HeadNormParams p) {
  const int64_t g = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (g >= p.num_heads_total) return;
  bf16_t* ptr = p.x + (g / p.heads) * p.token_stride + (g % p.heads) * p.head_stride;
  float ss = 0.0f;
  for (int i = lane; i < p.head_dim; i += 32) {
    float v = __bfloat162float(ptr[i]);
    ss += v * v;
  }
  ss = WarpSum(ss);
  const float inv = rsqrtf(ss / p.head_dim + p.eps);
  const NormWeight nw{p.w, p.w_f32};
  for (int i = lane; i < p.head_dim; i += 32)
    ptr[i] = __float2bfloat16(nw.At(i) * (__bfloat162float(ptr[i]) * inv));
}

// ---- RoPE -------------------------------------------------------------------------------
struct RopeKernelParams {
  bf16_t* q;
  int64_t q_token_stride, q_head_stride;
  bf16_t* k;
  int64_t k_token_stride, k_head_stride;
  const int32_t* positions;
  const float* inv_freq;  // [rot / 2], from RopeInvFreq (the CPU twin's frequencies)
  int64_t tokens;
  int q_heads, k_heads, rot;
  bool interleaved;
  float attention_factor;
};

// One warp per (token, kRopeHeadsPerWarp heads): lane l owns the pairs i = l + 32 j (j < 4, so
// rot <= 256), computes their cos/sin once, then rotates them in each of its heads. Pair i is
// (i, i + rot/2) in neox style, (2i, 2i + 1) when interleaved. Loads of all of a warp's heads
// are issued before any store (decode has one token: its few warps must not serialise).
constexpr int kRopeHeadsPerWarp = 4;
constexpr int kRopeMaxPairsPerLane = 4;

__global__ void RopeKernel(const __grid_constant__ RopeKernelParams p) {
  const int warps_per_token = (p.q_heads + p.k_heads + kRopeHeadsPerWarp - 1) / kRopeHeadsPerWarp;
  const int64_t gw = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const int64_t t = gw / warps_per_token;
  const int h0 = static_cast<int>(gw % warps_per_token) * kRopeHeadsPerWarp;
  if (t >= p.tokens) return;
  const int half = p.rot / 2;
  const float pos = static_cast<float>(p.positions[t]);
  float cs[kRopeMaxPairsPerLane], sn[kRopeMaxPairsPerLane];
#pragma unroll
  for (int j = 0; j < kRopeMaxPairsPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < half) {
      sincosf(pos * p.inv_freq[i], &sn[j], &cs[j]);  // angle in fp32, as the CPU twin
      cs[j] *= p.attention_factor;
      sn[j] *= p.attention_factor;
    }
  }
  bf16_t* heads[kRopeHeadsPerWarp];
  float a[kRopeHeadsPerWarp][kRopeMaxPairsPerLane], b[kRopeHeadsPerWarp][kRopeMaxPairsPerLane];
#pragma unroll
  for (int hh = 0; hh < kRopeHeadsPerWarp; ++hh) {
    const int h = h0 + hh;
    heads[hh] = h >= p.q_heads + p.k_heads ? nullptr
                : h < p.q_heads             ? p.q + t * p.q_token_stride + h * p.q_head_stride
                                            : p.k + t * p.k_token_stride + (h - p.q_heads) * p.k_head_stride;
#pragma unroll
    for (int j = 0; j < kRopeMaxPairsPerLane; ++j) {
      const int i = lane + 32 * j;
      if (heads[hh] == nullptr || i >= half) continue;
      const int ia = p.interleaved ? 2 * i : i, ib = p.interleaved ? 2 * i + 1 : i + half;
      a[hh][j] = __bfloat162float(heads[hh][ia]);
      b[hh][j] = __bfloat162float(heads[hh][ib]);
    }
  }
#pragma unroll
  for (int hh = 0; hh < kRopeHeadsPerWarp; ++hh) {
#pragma unroll
    for (int j = 0; j < kRopeMaxPairsPerLane; ++j) {
      const int i = lane + 32 * j;
      if (heads[hh] == nullptr || i >= half) continue;
      const int ia = p.interleaved ? 2 * i : i, ib = p.interleaved ? 2 * i + 1 : i + half;
      heads[hh][ia] = __float2bfloat16(a[hh][j] * cs[j] - b[hh][j] * sn[j]);
      heads[hh][ib] = __float2bfloat16(b[hh][j] * cs[j] + a[hh][j] * sn[j]);
    }
  }
}

// ---- SiLU-mul and add -------------------------------------------------------------------
struct SiluMulParams {
  const bf16_t* gate_up;
  int64_t in_stride;
  bf16_t* out;
  int64_t out_stride;
  int64_t rows;
  int inter;
};

__device__ __forceinline__ float Silu(float g) { return g / (1.0f + expf(-g)); }

template <bool kVec>
__global__ void SiluMulKernel(const __grid_constant__ SiluMulParams p) {
  const int per_row = kVec ? p.inter / 8 : p.inter;
  const int64_t n = p.rows * per_row;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / per_row;
    const int c = idx % per_row;
    const bf16_t* g = p.gate_up + r * p.in_stride;
    bf16_t* o = p.out + r * p.out_stride;
    if constexpr (kVec) {
      float a[8], b[8];
      Unpack8(reinterpret_cast<const Bf16x8*>(g)[c], a);
      Unpack8(reinterpret_cast<const Bf16x8*>(g + p.inter)[c], b);
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = Silu(a[i]) * b[i];
      Store8(o + 8 * c, Pack8(a));
    } else {
      o[c] = __float2bfloat16(Silu(__bfloat162float(g[c])) * __bfloat162float(g[c + p.inter]));
    }
  }
}

struct AddParams {
  bf16_t* x;
  int64_t x_stride;
  const bf16_t* y;
  int64_t y_stride;
  int64_t rows;
  int cols;
};

template <bool kVec>
__global__ void AddKernel(const __grid_constant__ AddParams p) {
  const int per_row = kVec ? p.cols / 8 : p.cols;
  const int64_t n = p.rows * per_row;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / per_row;
    const int c = idx % per_row;
    bf16_t* x = p.x + r * p.x_stride;
    const bf16_t* y = p.y + r * p.y_stride;
    if constexpr (kVec) {
      float a[8], b[8];
      Unpack8(reinterpret_cast<const Bf16x8*>(x)[c], a);
      Unpack8(reinterpret_cast<const Bf16x8*>(y)[c], b);
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] += b[i];
      Store8(x + 8 * c, Pack8(a));
    } else {
      x[c] = __float2bfloat16(__bfloat162float(x[c]) + __bfloat162float(y[c]));
    }
  }
}

// ---- paged KV write ---------------------------------------------------------------------
struct KvWriteParams {
  const bf16_t* k;
  int64_t k_token_stride, k_head_stride;
  const bf16_t* v;
  int64_t v_token_stride, v_head_stride;
  bf16_t* k_cache;  // [num_blocks, Hk, block_size, Dk] contiguous
  bf16_t* v_cache;  // [num_blocks, Hk, block_size, Dv] contiguous; null: shared with k (MLA latent)
  const int32_t* slots;
  int64_t num_slots;
  int heads, block_size, k_dim, v_dim;
};

template <bool kVec>
__global__ void KvWriteKernel(const __grid_constant__ KvWriteParams p) {
  const int64_t t = blockIdx.x;
  const int32_t slot = p.slots[t];
  if (slot < 0 || slot >= p.num_slots) return;  // padding token
  const int64_t block = slot / p.block_size, offset = slot % p.block_size;
  constexpr int kW = kVec ? 8 : 1;
  const int k_per_head = p.k_dim / kW, v_per_head = p.v_cache ? p.v_dim / kW : 0;
  const int k_items = p.heads * k_per_head, total = k_items + p.heads * v_per_head;
  for (int idx = threadIdx.x; idx < total; idx += blockDim.x) {
    const bool is_v = idx >= k_items;
    const int j = is_v ? idx - k_items : idx;
    const int per_head = is_v ? v_per_head : k_per_head;
    const int h = j / per_head, c = j % per_head;
    const bf16_t* src = is_v ? p.v + t * p.v_token_stride + h * p.v_head_stride
                             : p.k + t * p.k_token_stride + h * p.k_head_stride;
    bf16_t* dst = is_v ? p.v_cache + ((block * p.heads + h) * p.block_size + offset) * p.v_dim
                       : p.k_cache + ((block * p.heads + h) * p.block_size + offset) * p.k_dim;
    if constexpr (kVec) {
      reinterpret_cast<uint4*>(dst)[c] = reinterpret_cast<const uint4*>(src)[c];
    } else {
      dst[c] = src[c];
    }
  }
}

// ---- strided copy -----------------------------------------------------------------------
struct CopyParams {
  const char* src;
  char* dst;
  int64_t s0, s1, d0, d1;  // strides in bytes of the two leading dims
  int64_t n1;               // extent of the middle dim
  int64_t vecs_per_row;     // innermost row in units of the vector type
  int64_t total;            // rows * vecs_per_row
};

// Flat over (i, j, vector of the row): every thread copies one vector.
template <typename V>
__global__ void CopyKernel(const __grid_constant__ CopyParams p) {
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < p.total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = idx / p.vecs_per_row, c = idx % p.vecs_per_row;
    const int64_t i = row / p.n1, j = row % p.n1;
    reinterpret_cast<V*>(p.dst + i * p.d0 + j * p.d1)[c] =
        reinterpret_cast<const V*>(p.src + i * p.s0 + j * p.s1)[c];
  }
}

int GridFor(int64_t n) {
  return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 132 * 16));
}

}  // namespace

void GatherRows(const TensorView& x, const TensorView& rows, const TensorView& out, cudaStream_t s) {
  CheckBf16(x, "gather x");
  CheckBf16(out, "gather out");
  CheckI32(rows, "gather rows");
  COROLLA_CHECK(x.rank() == 2 && out.rank() == 2 && rows.numel() == out.dim(0) &&
                x.dim(1) == out.dim(1))
      << "gather x " << x.ToString() << " rows " << rows.ToString() << " out " << out.ToString();
  if (out.dim(0) == 0) return;
  GatherParams p{x.ptr<bf16_t>(), RowStride(x), x.dim(0), rows.ptr<int32_t>(), out.ptr<bf16_t>(),
                 RowStride(out), static_cast<int>(x.dim(1))};
  const int threads = 128;
  if (Vectorisable(x, p.cols) && Vectorisable(out, p.cols))
    GatherRowsKernel<true><<<out.dim(0), threads, 0, s>>>(p);
  else
    GatherRowsKernel<false><<<out.dim(0), threads, 0, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

void RmsNorm(const TensorView& x, const TensorView& w, float eps, const TensorView& out,
             const TensorView* residual, cudaStream_t s) {
  CheckBf16(x, "rmsnorm x");
  COROLLA_CHECK(w.dtype == DType::kBF16 || w.dtype == DType::kF32) << "rmsnorm w " << w.ToString();
  CheckBf16(out, "rmsnorm out");
  const int64_t rows = x.dim(0), cols = x.dim(1);
  COROLLA_CHECK(x.rank() == 2 && w.numel() == cols && out.dim(0) == rows && out.dim(1) == cols)
      << "rmsnorm x " << x.ToString() << " w " << w.ToString() << " out " << out.ToString();
  if (residual) {
    CheckBf16(*residual, "rmsnorm residual");
    COROLLA_CHECK(residual->shape == x.shape) << "residual " << residual->ToString();
  }
  if (rows == 0) return;
  RmsNormParams p{x.ptr<bf16_t>(), RowStride(x), w.data, w.dtype == DType::kF32, out.ptr<bf16_t>(), RowStride(out),
                  residual ? residual->ptr<bf16_t>() : nullptr, residual ? RowStride(*residual) : 0,
                  static_cast<int>(cols), eps, Tuning().pdl_early_trigger && Tuning().rmsnorm_early_trigger};
  bool vec = Vectorisable(x, cols) && Vectorisable(w, cols) && Vectorisable(out, cols) &&
             (!residual || Vectorisable(*residual, cols));
  const int threads = vec ? std::clamp<int>((cols / 8 + 31) / 32 * 32, 32, 1024) : 256;
  p.timeline = TimelineRecord(residual ? "RmsNorm+residual" : "RmsNorm", rows, s);
  if (vec)
    LaunchPdl(RmsNormKernel<true>, dim3(rows), dim3(threads), 0, s, 1, p);
  else
    LaunchPdl(RmsNormKernel<false>, dim3(rows), dim3(threads), 0, s, 1, p);
}

void HeadRmsNorm(const TensorView& x, const TensorView& w, float eps, cudaStream_t s) {
  CheckBf16(x, "head rmsnorm x");
  COROLLA_CHECK(w.dtype == DType::kBF16 || w.dtype == DType::kF32) << "head rmsnorm w " << w.ToString();
  COROLLA_CHECK(x.rank() == 3 && w.numel() == x.dim(2))
      << "head rmsnorm x " << x.ToString() << " w " << w.ToString();
  const int64_t total = x.dim(0) * x.dim(1);
  if (total == 0) return;
  HeadNormParams p{x.ptr<bf16_t>(), x.strides[0], x.strides[1], w.data, w.dtype == DType::kF32, total,
                   static_cast<int>(x.dim(1)), static_cast<int>(x.dim(2)), eps};
  bool launched = false;
  if (Vectorisable(x, x.dim(2)) && Vectorisable(w, x.dim(2))) {
    launched = DispatchHeadDim(p.head_dim, [&](auto d) {
      constexpr int kD = decltype(d)::value;
      const int64_t threads_total = total * (kD / 8);
      HeadRmsNormKernel<kD><<<CeilDiv(threads_total, kThreads), kThreads, 0, s>>>(p);
    });
  }
  if (!launched) HeadRmsNormGenericKernel<<<CeilDiv(total * 32, kThreads), kThreads, 0, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

void Rope(const TensorView& q, const TensorView& k, const TensorView& positions,
          const RopeParams& params, const float* inv_freq, cudaStream_t s) {
  CheckBf16(q, "rope q");
  CheckBf16(k, "rope k");
  CheckI32(positions, "rope positions");
  const int64_t tokens = q.dim(0), d = q.dim(2);
  const int rot = params.rotary_dim;
  COROLLA_CHECK(q.rank() == 3 && k.rank() == 3 && rot > 0 && rot % 2 == 0 && rot <= d &&
                rot <= 2 * 32 * kRopeMaxPairsPerLane &&
                k.dim(0) == tokens && k.dim(2) == d && positions.numel() == tokens)
      << "rope q " << q.ToString() << " k " << k.ToString() << " rot " << rot;
  if (tokens == 0) return;
  RopeKernelParams p{q.ptr<bf16_t>(), q.strides[0], q.strides[1], k.ptr<bf16_t>(), k.strides[0],
                     k.strides[1], positions.ptr<int32_t>(), inv_freq, tokens,
                     static_cast<int>(q.dim(1)), static_cast<int>(k.dim(1)), rot,
                     params.interleaved, params.attention_factor};
  const int64_t warps = tokens * CeilDiv(q.dim(1) + k.dim(1), kRopeHeadsPerWarp);
  RopeKernel<<<CeilDiv(warps * 32, 128), 128, 0, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

void Copy(const TensorView& src, const TensorView& dst, cudaStream_t s) {
  const int r = src.rank();
  COROLLA_CHECK(src.shape == dst.shape && src.dtype == dst.dtype && r >= 1 && r <= 3 &&
                src.strides[r - 1] == 1 && dst.strides[r - 1] == 1 && src.device == Device::kCuda &&
                dst.device == Device::kCuda)
      << "copy " << src.ToString() << " to " << dst.ToString();
  if (src.numel() == 0) return;
  const int64_t size = DTypeSize(src.dtype);
  const int64_t n0 = r >= 3 ? src.dim(0) : 1, n1 = r >= 2 ? src.dim(r - 2) : 1, row_bytes = src.dim(r - 1) * size;
  CopyParams p{static_cast<const char*>(src.data), static_cast<char*>(dst.data),
               r >= 3 ? src.strides[0] * size : 0, r >= 2 ? src.strides[r - 2] * size : 0,
               r >= 3 ? dst.strides[0] * size : 0, r >= 2 ? dst.strides[r - 2] * size : 0, n1, 0, 0};
  // The widest vector every row start, stride and row length allows.
  uint64_t bits = reinterpret_cast<uintptr_t>(src.data) | reinterpret_cast<uintptr_t>(dst.data) |
                  static_cast<uint64_t>(row_bytes) | static_cast<uint64_t>(p.s0) | static_cast<uint64_t>(p.s1) |
                  static_cast<uint64_t>(p.d0) | static_cast<uint64_t>(p.d1);
  const int width = bits % 16 == 0 ? 16 : bits % 8 == 0 ? 8 : bits % 4 == 0 ? 4 : bits % 2 == 0 ? 2 : 1;
  p.vecs_per_row = row_bytes / width;
  p.total = n0 * n1 * p.vecs_per_row;
  const int grid = GridFor(p.total);
  switch (width) {
    case 16: CopyKernel<uint4><<<grid, kThreads, 0, s>>>(p); break;
    case 8: CopyKernel<uint2><<<grid, kThreads, 0, s>>>(p); break;
    case 4: CopyKernel<uint32_t><<<grid, kThreads, 0, s>>>(p); break;
    case 2: CopyKernel<uint16_t><<<grid, kThreads, 0, s>>>(p); break;
    default: CopyKernel<uint8_t><<<grid, kThreads, 0, s>>>(p); break;
  }
  COROLLA_CUDA_CHECK_LAUNCH();
}

void SiluMul(const TensorView& gate_up, const TensorView& out, cudaStream_t s) {
  CheckBf16(gate_up, "silu_mul in");
  CheckBf16(out, "silu_mul out");
  const int64_t rows = out.dim(0), inter = out.dim(1);
  COROLLA_CHECK(gate_up.dim(0) == rows && gate_up.dim(1) == 2 * inter)
      << "silu_mul in " << gate_up.ToString() << " out " << out.ToString();
  if (rows == 0) return;
  SiluMulParams p{gate_up.ptr<bf16_t>(), RowStride(gate_up), out.ptr<bf16_t>(), RowStride(out), rows,
                  static_cast<int>(inter)};
  if (Vectorisable(gate_up, inter) && Vectorisable(out, inter))
    SiluMulKernel<true><<<GridFor(rows * inter / 8), kThreads, 0, s>>>(p);
  else
    SiluMulKernel<false><<<GridFor(rows * inter), kThreads, 0, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

void Add(const TensorView& x, const TensorView& y, cudaStream_t s) {
  CheckBf16(x, "add x");
  CheckBf16(y, "add y");
  COROLLA_CHECK(x.shape == y.shape && x.rank() == 2) << "add x " << x.ToString() << " y " << y.ToString();
  if (x.numel() == 0) return;
  AddParams p{x.ptr<bf16_t>(), RowStride(x), y.ptr<bf16_t>(), RowStride(y), x.dim(0),
              static_cast<int>(x.dim(1))};
  if (Vectorisable(x, p.cols) && Vectorisable(y, p.cols))
    AddKernel<true><<<GridFor(x.numel() / 8), kThreads, 0, s>>>(p);
  else
    AddKernel<false><<<GridFor(x.numel()), kThreads, 0, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

void KvWrite(const TensorView& k, const TensorView& v, const KvCacheView& cache,
             const AttentionBatch& batch, cudaStream_t s) {
  CheckBf16(k, "kv_write k");
  CheckBf16(v, "kv_write v");
  CheckBf16(cache.k, "kv cache k");
  CheckBf16(cache.v, "kv cache v");
  CheckI32(batch.slot_mapping, "slot_mapping");
  const int64_t tokens = k.dim(0), heads = k.dim(1), dk = k.dim(2), dv = v.dim(2);
  // MLA: one latent cache holds K and V; k and v are then the same rows, written once.
  const bool shared = cache.k.data == cache.v.data;
  COROLLA_CHECK(k.rank() == 3 && v.rank() == 3 && v.dim(0) == tokens && v.dim(1) == heads &&
                cache.k.rank() == 4 && cache.k.dim(1) == heads && cache.k.dim(3) == dk && cache.k.is_contiguous() &&
                cache.v.rank() == 4 && cache.v.dim(0) == cache.k.dim(0) && cache.v.dim(1) == heads &&
                cache.v.dim(2) == cache.k.dim(2) && cache.v.dim(3) == dv && cache.v.is_contiguous() &&
                (!shared || (k.data == v.data && dv == dk)) && batch.slot_mapping.numel() == tokens)
      << "kv_write k " << k.ToString() << " v " << v.ToString() << " cache k " << cache.k.ToString() << " v "
      << cache.v.ToString();
  if (tokens == 0) return;
  KvWriteParams p{k.ptr<bf16_t>(), k.strides[0], k.strides[1], v.ptr<bf16_t>(), v.strides[0],
                  v.strides[1], cache.k.ptr<bf16_t>(), shared ? nullptr : cache.v.ptr<bf16_t>(),
                  batch.slot_mapping.ptr<int32_t>(), cache.k.dim(0) * cache.block_size(),
                  static_cast<int>(heads), cache.block_size(), static_cast<int>(dk), static_cast<int>(dv)};
  if (Vectorisable(k, dk) && Vectorisable(v, dv))
    KvWriteKernel<true><<<tokens, 128, 0, s>>>(p);
  else
    KvWriteKernel<false><<<tokens, 128, 0, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

}  // namespace corolla::cuda
