// Causal GQA attention over the paged, heads-major KV cache ([num_blocks, Hk, block_size, D]),
// FlashAttention-style: one CTA per (sequence, kv head, tile of 16 query rows), where a query
// row is a (token, head of the group) pair, so a KV head is read once for all its query heads.
// K/V stream through shared memory 32 keys at a time with an online softmax (fp32, log2
// domain) and fp32 accumulators; the same kernel serves decode (q_len 1), prefill, and chunked
// prefill over a cached prefix. SIMT fp32 math: the tensor-core (mma/wgmma) version is the
// next step, and long-context decode wants a split-KV variant.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace corolla::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kBlockM = kWarps * kRowsPerWarp;  // query rows per CTA
constexpr int kBlockN = 32;                     // keys per tile: one per lane

struct AttentionParams {
  const bf16_t* q;
  int64_t q_token_stride, q_head_stride;
  bf16_t* out;
  int64_t out_token_stride, out_head_stride;
  const bf16_t* k_cache;
  const bf16_t* v_cache;
  const int32_t* block_tables;
  int64_t table_stride;
  const int32_t* query_start;
  const int32_t* seq_lens;
  int kv_heads, group, block_size;
  float scale_log2;  // softmax scale * log2(e)
};

template <int kD>
__global__ void __launch_bounds__(kWarps * 32) AttentionKernel(const __grid_constant__ AttentionParams p) {
  constexpr int kKStride = kD + 2;  // padded K rows: lane j reads row j conflict-free
  constexpr int kPerLane = kD / 32;
  __shared__ __align__(16) bf16_t sQ[kBlockM][kD];
  __shared__ __align__(16) bf16_t sK[kBlockN * kKStride];
  __shared__ __align__(16) bf16_t sV[kBlockN][kD];

  const int b = blockIdx.z, kvh = blockIdx.y;
  const int q0 = p.query_start[b];
  const int q_len = p.query_start[b + 1] - q0;
  const int rows_total = q_len * p.group;
  const int row0 = blockIdx.x * kBlockM;
  if (row0 >= rows_total) return;
  const int prefix = p.seq_lens[b] - q_len;
  const int32_t* table = p.block_tables + b * p.table_stride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // Q tile -> shared (rows past the sequence's rows are zero).
  for (int idx = threadIdx.x; idx < kBlockM * kD / 2; idx += blockDim.x) {
    const int r = idx / (kD / 2), c = idx % (kD / 2);
    const int row = row0 + r;
    __nv_bfloat162 v = __floats2bfloat162_rn(0.f, 0.f);
    if (row < rows_total) {
      const int tok = row / p.group, head = kvh * p.group + row % p.group;
      v = reinterpret_cast<const __nv_bfloat162*>(p.q + (q0 + tok) * p.q_token_stride +
                                                   head * p.q_head_stride)[c];
    }
    reinterpret_cast<__nv_bfloat162*>(&sQ[r][0])[c] = v;
  }

  // This warp's rows: position (or -1 when the row does not exist).
  int pos[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int row = row0 + warp * kRowsPerWarp + r;
    pos[r] = row < rows_total ? prefix + row / p.group : -1;
  }
  const int last_row = min(row0 + kBlockM, rows_total) - 1;
  const int kv_end = prefix + last_row / p.group + 1;  // keys [0, kv_end) are visible to the tile

  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][kPerLane];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) o[r][c] = 0.f;
  }

  for (int n0 = 0; n0 < kv_end; n0 += kBlockN) {
    __syncthreads();  // previous tile fully consumed (and sQ written, on the first pass)
    for (int idx = threadIdx.x; idx < kBlockN * kD / 8; idx += blockDim.x) {
      const int j = idx / (kD / 8), c = idx % (kD / 8);
      const int key = n0 + j;
      Bf16x8 kv = {}, vv = {};
      if (key < kv_end) {
        const int64_t base =
            ((static_cast<int64_t>(table[key / p.block_size]) * p.kv_heads + kvh) * p.block_size +
             key % p.block_size) * kD;
        kv = reinterpret_cast<const Bf16x8*>(p.k_cache + base)[c];
        vv = reinterpret_cast<const Bf16x8*>(p.v_cache + base)[c];
      }
      __nv_bfloat162* krow = reinterpret_cast<__nv_bfloat162*>(sK + j * kKStride + c * 8);
#pragma unroll
      for (int i = 0; i < 4; ++i) krow[i] = kv.h[i];
      reinterpret_cast<Bf16x8*>(&sV[j][0])[c] = vv;
    }
    __syncthreads();

    // Scores of key n0 + lane against this warp's rows.
    float s[kRowsPerWarp] = {};
    const __nv_bfloat162* krow = reinterpret_cast<const __nv_bfloat162*>(sK + lane * kKStride);
#pragma unroll 8
    for (int i = 0; i < kD / 2; ++i) {
      const float2 kf = __bfloat1622float2(krow[i]);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float2 qf =
            __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(&sQ[warp * kRowsPerWarp + r][0])[i]);
        s[r] = fmaf(qf.x, kf.x, fmaf(qf.y, kf.y, s[r]));
      }
    }
    const int key = n0 + lane;
    float pr[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float sc = key <= pos[r] ? s[r] * p.scale_log2 : -INFINITY;
      const float m_new = fmaxf(m[r], WarpMax(sc));
      float alpha = 1.f, pv = 0.f;
      if (m_new != -INFINITY) {
        alpha = exp2f(m[r] - m_new);  // 0 when m was -inf
        pv = exp2f(sc - m_new);
      }
      m[r] = m_new;
      l[r] = l[r] * alpha + WarpSum(pv);
      pr[r] = pv;
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) o[r][c] *= alpha;
    }
    // O += P V: lane owns dims lane + 32 c.
    const int n_valid = min(kBlockN, kv_end - n0);
    for (int j = 0; j < n_valid; ++j) {
      float vf[kPerLane];
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) vf[c] = __bfloat162float(sV[j][lane + 32 * c]);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float pj = __shfl_sync(0xffffffffu, pr[r], j);
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) o[r][c] = fmaf(pj, vf[c], o[r][c]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (pos[r] < 0) continue;
    const int row = row0 + warp * kRowsPerWarp + r;
    const int tok = row / p.group, head = kvh * p.group + row % p.group;
    bf16_t* dst = p.out + (q0 + tok) * p.out_token_stride + head * p.out_head_stride;
    const float inv = 1.f / l[r];
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) dst[lane + 32 * c] = __float2bfloat16(o[r][c] * inv);
  }
}

}  // namespace

void Attention(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch,
               float scale, const TensorView& out, cudaStream_t s) {
  const TensorView& kc = cache.k;
  COROLLA_CHECK(cache.k.data != cache.v.data && out.dim(2) == q.dim(2))
      << "attention: MLA (shared latent cache, Dv < Dk) is not implemented on CUDA yet";
  COROLLA_CHECK(q.dtype == DType::kBF16 && out.dtype == DType::kBF16 && kc.dtype == DType::kBF16 &&
                cache.v.dtype == DType::kBF16 && q.rank() == 3 && out.shape == q.shape &&
                kc.rank() == 4 && kc.is_contiguous() && cache.v.is_contiguous() &&
                cache.v.shape == kc.shape && kc.dim(3) == q.dim(2) && q.dim(1) % kc.dim(1) == 0 &&
                q.strides[2] == 1 && out.strides[2] == 1 && q.strides[1] % 2 == 0 &&
                q.strides[0] % 2 == 0 && batch.query_start.dtype == DType::kI32 &&
                batch.seq_lens.dtype == DType::kI32 && batch.block_tables.dtype == DType::kI32)
      << "attention q " << q.ToString() << " cache " << kc.ToString() << " out " << out.ToString();
  const int num_seqs = static_cast<int>(batch.seq_lens.numel());
  if (q.dim(0) == 0 || num_seqs == 0) return;
  const int group = static_cast<int>(q.dim(1) / kc.dim(1));
  AttentionParams p{q.ptr<bf16_t>(), q.strides[0], q.strides[1], out.ptr<bf16_t>(), out.strides[0],
                    out.strides[1], kc.ptr<bf16_t>(), cache.v.ptr<bf16_t>(),
                    batch.block_tables.ptr<int32_t>(),
                    batch.block_tables.rank() == 2 ? batch.block_tables.dim(1) : 0,
                    batch.query_start.ptr<int32_t>(), batch.seq_lens.ptr<int32_t>(),
                    static_cast<int>(kc.dim(1)), group, cache.block_size(),
                    scale * 1.4426950408889634f};
  // max_q_len is a host hint; without it, every token could belong to one sequence.
  const int max_q_len = batch.max_q_len > 0 ? batch.max_q_len : static_cast<int>(q.dim(0));
  dim3 grid(CeilDiv(static_cast<int64_t>(max_q_len) * group, kBlockM), kc.dim(1), num_seqs);
  bool ok = DispatchHeadDim(static_cast<int>(q.dim(2)), [&](auto d) {
    AttentionKernel<decltype(d)::value><<<grid, kWarps * 32, 0, s>>>(p);
  });
  COROLLA_CHECK(ok) << "attention: head dim " << q.dim(2) << " is not in the supported table (32, 64, 128, 256)";
  COROLLA_CUDA_CHECK_LAUNCH();
}

}  // namespace corolla::cuda
