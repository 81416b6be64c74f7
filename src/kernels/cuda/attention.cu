// Causal GQA attention over the paged, heads-major KV cache ([num_blocks, Hk, block_size, D]),
// FlashAttention-style: one CTA per (sequence, kv head, tile of 16 query rows), where a query
// row is a (token, head of the group) pair, so a KV head is read once for all its query heads.
// K/V stream through shared memory 32 keys at a time with an online softmax (fp32, log2
// domain) and fp32 accumulators; the same kernel serves decode (q_len 1), prefill, and chunked
// prefill over a cached prefix. K and V dims may differ (Dv <= Dk), and the cache may hold K and
// V as one tensor (MLA's latent: V is the first Dv dims of each K row), which the kernel then
// reads once per tile for both, for all the query heads of the tile. SIMT fp32 math.
// Attention() below is the host entry for both this kernel and the tensor-core one
// (attention_mma.cu, Dk == Dv with separate K and V): it checks, plans, dispatches through the
// one table of supported shapes, and merges split-KV partials. Decode batches that would
// under-fill the GPU split each sequence's keys across CTAs (split-KV): the host picks the
// number of splits from its hints (upper bounds under CUDA-graph replay), each CTA derives its
// key range from its own sequence's device-side length, and SplitKvMergeKernel
// (split_kv_merge.cuh) merges the partial softmax states (one partial format for all kernels).
// Prefill at D 128 (more than 16 query tokens in a sequence) goes to the wgmma kernel
// (attention_wgmma.cu) on sm_90 unless Tuning().attention_wgmma is off.
// Decode with one token a sequence (max_q_len 1) at D 64/128/256, group <= 16, goes to the
// small-batch decode kernel (attention_decode.cu) unless Tuning().attention_decode_kernel is off.
#include <algorithm>
#include <string>
#include <tuple>

#include "kernels/cuda/attention_prologue.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/split_kv_merge.cuh"
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
  // Split-KV (decode): blockIdx.x = row tile + row_tiles * split; split s reads the keys
  // SplitKeyRange (split_keys.h) deals it in kBlockN tiles of the sequence's device-side
  // length, and writes unnormalised partials, merged by SplitKvMergeKernel.
  // num_splits 1: no split, the CTA writes out itself.
  int row_tiles, num_splits, q_heads;
  float* part_o;   // [T * Hq, num_splits, D]
  float* part_ml;  // [T * Hq, num_splits, 2]: running max (log2 domain) and sum
};

// Shared memory of one CTA (dynamic): Q tile, padded K tile, V tile unless shared with K.
template <int kDk, int kDv, bool kShared>
constexpr size_t AttentionSmemBytes() {
  return sizeof(bf16_t) * (kBlockM * kDk + kBlockN * (kDk + 2) + (kShared ? 0 : kBlockN * kDv));
}

template <int kDk, int kDv, bool kShared>
__global__ void __launch_bounds__(kWarps * 32) AttentionKernel(const __grid_constant__ AttentionParams p) {
  constexpr int kD = kDk;
  constexpr int kKStride = kD + 2;  // padded K rows: lane j reads row j conflict-free
  constexpr int kPerLane = kDv / 32;
  extern __shared__ __align__(16) unsigned char attn_smem[];
  bf16_t(*sQ)[kD] = reinterpret_cast<bf16_t(*)[kD]>(attn_smem);
  bf16_t* sK = reinterpret_cast<bf16_t*>(attn_smem) + kBlockM * kD;
  bf16_t* sVbase = sK + kBlockN * kKStride;
  // V row j: its own tile, or the first kDv dims of K row j.
  auto v_at = [&](int j, int c) -> bf16_t { return kShared ? sK[j * kKStride + c] : sVbase[j * kDv + c]; };

  const int b = blockIdx.z, kvh = blockIdx.y;
  const int q0 = p.query_start[b];
  const int q_len = p.query_start[b + 1] - q0;
  const int rows_total = q_len * p.group;
  const int split = blockIdx.x / p.row_tiles;
  const int row0 = (blockIdx.x % p.row_tiles) * kBlockM;
  if (row0 >= rows_total) return;
  const int seq_len = p.seq_lens[b];
  const int prefix = seq_len - q_len;
  const int32_t* table = p.block_tables + b * p.table_stride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int last_row = min(row0 + kBlockM, rows_total) - 1;
  const int visible_end = prefix + last_row / p.group + 1;  // keys [0, visible_end) are visible to the tile
  const KeyRange keys = SplitKeyRange(seq_len, p.num_splits, split, kBlockN, visible_end);
  const int kv_begin = keys.begin, kv_end = keys.end;
  if (kv_begin >= kv_end) {  // an empty split: mark its partials empty (the merge skips them)
    for (int r = threadIdx.x; p.num_splits > 1 && r < kBlockM && row0 + r < rows_total; r += blockDim.x) {
      const int row = row0 + r;
      const int64_t part = (static_cast<int64_t>(q0 + row / p.group) * p.q_heads + kvh * p.group + row % p.group) *
                               p.num_splits + split;
      p.part_ml[2 * part] = -INFINITY;
      p.part_ml[2 * part + 1] = 0.f;
    }
    return;
  }

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

  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][kPerLane];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) o[r][c] = 0.f;
  }

  for (int n0 = kv_begin; n0 < kv_end; n0 += kBlockN) {
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
        if (!kShared && c < kDv / 8) {
          const int64_t vbase =
              ((static_cast<int64_t>(table[key / p.block_size]) * p.kv_heads + kvh) * p.block_size +
               key % p.block_size) * kDv;
          vv = reinterpret_cast<const Bf16x8*>(p.v_cache + vbase)[c];
        }
      }
      __nv_bfloat162* krow = reinterpret_cast<__nv_bfloat162*>(sK + j * kKStride + c * 8);
#pragma unroll
      for (int i = 0; i < 4; ++i) krow[i] = kv.h[i];
      if (!kShared && c < kDv / 8) Store8(sVbase + j * kDv + 8 * c, vv);
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
      for (int c = 0; c < kPerLane; ++c) vf[c] = __bfloat162float(v_at(j, lane + 32 * c));
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
    if (p.num_splits > 1) {  // unnormalised partials (m -inf, l 0 when the split saw no key)
      const int64_t part = (static_cast<int64_t>(q0 + tok) * p.q_heads + head) * p.num_splits + split;
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) p.part_o[part * kDv + lane + 32 * c] = o[r][c];
      if (lane == 0) {
        p.part_ml[2 * part] = m[r];
        p.part_ml[2 * part + 1] = l[r];
      }
      continue;
    }
    bf16_t* dst = p.out + (q0 + tok) * p.out_token_stride + head * p.out_head_stride;
    const float inv = 1.f / l[r];
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) dst[lane + 32 * c] = __float2bfloat16(o[r][c] * inv);
  }
}

// The one table of (Dk, Dv) pairs the attention kernels are built for: the plain head dims, and
// MLA's (qk_nope + rope, v) for the decompressed form and (kv_lora + rope, kv_lora) for the
// absorbed one (DeepSeek-V3: 192/128, 576/512; the test fixture: 48/32). kMma: the tensor-core
// kernel (attention_mma.cu, which instantiates exactly these dims) serves the pair too when K and
// V are separate tensors with 16-byte aligned rows; the SIMT kernel serves every pair. Absorbed
// MLA decode (576/512, 48/32 over the shared latent, one token per sequence) goes to
// mla_decode.cu first (MlaDecodeServes).
template <int kDk_, int kDv_, bool kMma_>
struct DimPair {
  static constexpr int kDk = kDk_, kDv = kDv_;
  static constexpr bool kMma = kMma_;
};
using AttentionDimTable =
    std::tuple<DimPair<32, 32, true>, DimPair<64, 64, true>, DimPair<128, 128, true>,
               DimPair<256, 256, true>, DimPair<48, 32, false>, DimPair<192, 128, true>,
               DimPair<576, 512, false>>;

// Calls fn(Pair{}) for the table's pair (dk, dv); false if there is none.
template <typename Fn, typename... Pairs>
bool DispatchDimPair(int dk, int dv, Fn&& fn, std::tuple<Pairs...>) {
  bool found = false;
  ((dk == Pairs::kDk && dv == Pairs::kDv ? (fn(Pairs{}), found = true) : false), ...);
  return found;
}
template <typename Fn>
bool DispatchAttentionDims(int dk, int dv, Fn&& fn) {
  return DispatchDimPair(dk, dv, static_cast<Fn&&>(fn), AttentionDimTable{});
}
template <typename... Pairs>
std::string DimPairNames(std::tuple<Pairs...>) {
  std::string s;
  ((s += (s.empty() ? "" : ", ") + std::to_string(Pairs::kDk) + "/" + std::to_string(Pairs::kDv) +
         (Pairs::kMma ? " (mma)" : "")),
   ...);
  return s;
}

template <int kDk, int kDv, bool kShared>
void LaunchAttention(const AttentionParams& p, dim3 grid, cudaStream_t s) {
  constexpr size_t smem = AttentionSmemBytes<kDk, kDv, kShared>();
  static const bool configured = [] {
    COROLLA_CUDA_CHECK(cudaFuncSetAttribute(AttentionKernel<kDk, kDv, kShared>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    return true;
  }();
  (void)configured;
  AttentionKernel<kDk, kDv, kShared><<<grid, kWarps * 32, smem, s>>>(p);
}

// Rows per CTA of the tensor-core kernel's two tile shapes (MmaTiles in attention_mma.cu, which
// checks the value it is given) and the keys of its tile, the smallest useful split.
constexpr int kMmaDecodeRows = 16;
constexpr int kMmaPrefillRows = 64;
constexpr int kMmaBlockN = 64;

bool RowsAligned16(const TensorView& t) {
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.strides[0] % 8 == 0 && t.strides[1] % 8 == 0;
}

}  // namespace

// attention_mma.cu (its only caller is Attention below): runs one plan on the tensor-core kernel;
// (kDk, kDv) a kMma pair of the table. True when the kernel merged the splits itself (the last
// split CTA of each row tile merges; Tuning().attention_fused_merge).
template <int kDk, int kDv>
bool AttentionMma(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch,
                  float scale_log2, int rows_per_cta, int row_tiles, int num_splits, float* part_o,
                  float* part_ml, const TensorView& out, cudaStream_t s);

// attention_decode.cu (its only callers are below): the small-batch decode kernel for
// one query token per sequence (max_q_len 1), Dk = Dv in {64, 128, 256}, separate K/V, group
// <= 16, Tuning().attention_decode_kernel on; it plans its own split-KV and merges.
bool AttentionDecodeServes(const TensorView& q, const KvCacheView& cache, int max_q_len);
// prologue: QkNormRopeAttention's, folded in (q holds the raw projection), or null. proj_w /
// proj_out (with the prologue): QkNormRopeAttentionProj's o projection folded in too, where the
// plan allows (one token, group <= 8): true when that kernel ran, false when nothing did.
bool AttentionDecode(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch, float scale_log2,
                     const TensorView& out, CachingAllocator& alloc, cudaStream_t s,
                     const DecodePrologue* prologue = nullptr, const TensorView* proj_w = nullptr,
                     const TensorView* proj_out = nullptr);

namespace {

// Attention's argument checks; true when the tensor-core kernels may take the call (else SIMT).
bool CheckAttention(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch, const TensorView& out) {
  const TensorView& kc = cache.k;
  const bool shared = kc.data == cache.v.data;  // MLA latent: V is the first Dv dims of K
  const int64_t dk = q.dim(2), dv = out.dim(2);
  COROLLA_CHECK(q.dtype == DType::kBF16 && out.dtype == DType::kBF16 && kc.dtype == DType::kBF16 &&
                cache.v.dtype == DType::kBF16 && q.rank() == 3 && out.rank() == 3 && out.dim(0) == q.dim(0) &&
                out.dim(1) == q.dim(1) && dv <= dk && kc.rank() == 4 && kc.is_contiguous() &&
                cache.v.is_contiguous() && cache.v.rank() == 4 && cache.v.dim(0) == kc.dim(0) &&
                cache.v.dim(1) == kc.dim(1) && cache.v.dim(2) == kc.dim(2) &&
                cache.v.dim(3) == (shared ? dk : dv) && kc.dim(3) == dk && q.dim(1) % kc.dim(1) == 0 &&
                q.strides[2] == 1 && out.strides[2] == 1 && q.strides[1] % 2 == 0 &&
                q.strides[0] % 2 == 0 && batch.query_start.dtype == DType::kI32 &&
                batch.seq_lens.dtype == DType::kI32 && batch.block_tables.dtype == DType::kI32)
      << "attention q " << q.ToString() << " cache k " << kc.ToString() << " v " << cache.v.ToString() << " out "
      << out.ToString();
  bool mma_dims = false;
  const bool supported = DispatchAttentionDims(static_cast<int>(dk), static_cast<int>(dv),
                                               [&](auto dims) { mma_dims = decltype(dims)::kMma; });
  COROLLA_CHECK(supported) << "attention: (Dk " << dk << ", Dv " << dv << ") is not in the supported table ("
                           << DimPairNames(AttentionDimTable{}) << ")";
  return mma_dims && Tuning().attention_mma && !shared && RowsAligned16(q) && RowsAligned16(out) &&
         reinterpret_cast<uintptr_t>(kc.data) % 16 == 0 && reinterpret_cast<uintptr_t>(cache.v.data) % 16 == 0;
}

}  // namespace

void Attention(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch,
               float scale, const TensorView& out, CachingAllocator& alloc, cudaStream_t s) {
  const bool use_mma = CheckAttention(q, cache, batch, out);
  const TensorView& kc = cache.k;
  const bool shared = kc.data == cache.v.data;
  const int64_t dk = q.dim(2), dv = out.dim(2);
  const int num_seqs = static_cast<int>(batch.seq_lens.numel());
  if (q.dim(0) == 0 || num_seqs == 0) return;
  if (shared && MlaDecodeServes(q, cache, batch, out)) return MlaDecode(q, cache, batch, scale, out, alloc, s);
  const int kv_heads = static_cast<int>(kc.dim(1));
  const int group = static_cast<int>(q.dim(1) / kv_heads);

  // The plan, from host hints only (under CUDA-graph replay they are upper bounds; the kernels
  // read each sequence's rows and keys on the device). max_q_len: without it, every token could
  // belong to one sequence.
  const int max_q_len = batch.max_q_len > 0 ? batch.max_q_len : static_cast<int>(q.dim(0));
  // Prefill at Dk 128 or 192 (DeepSeek's decompressed MLA), Dv 128 on wgmma (attention_wgmma.cu):
  // above 16 tokens a sequence, where the plan below never splits the keys.
  if (use_mma && (dk == 128 || dk == 192) && dv == 128 && max_q_len > 16 &&
      Tuning().attention_wgmma && AttentionWgmmaSupported()) {
    // Decodes beside prompt chunks: the leading one-token sequences on the decode kernel, the
    // prompts alone on wgmma (whose q and out stay whole: query_start holds absolute rows).
    const int num_decode = batch.num_decode_seqs;
    if (Tuning().attention_mixed_decode && num_decode > 0 && num_decode < num_seqs &&
        num_decode <= q.dim(0) && dk == dv && batch.block_tables.rank() == 2 &&
        AttentionDecodeServes(q, cache, 1)) {
      const TensorView q_decode = q.Slice(0, num_decode);
      AttentionBatch decode = batch, prompts = batch;
      decode.query_start = batch.query_start.Slice(0, num_decode + 1);
      decode.seq_lens = batch.seq_lens.Slice(0, num_decode);
      decode.block_tables = batch.block_tables.Slice(0, num_decode);
      if (batch.slot_mapping.rank() == 1 && batch.slot_mapping.dim(0) >= num_decode)
        decode.slot_mapping = batch.slot_mapping.Slice(0, num_decode);
      decode.max_q_len = 1;
      prompts.query_start = batch.query_start.Slice(num_decode, num_seqs + 1);
      prompts.seq_lens = batch.seq_lens.Slice(num_decode, num_seqs);
      prompts.block_tables = batch.block_tables.Slice(num_decode, num_seqs);
      prompts.num_decode_seqs = 0;
      AttentionDecode(q_decode, cache, decode, scale * 1.4426950408889634f,
                      out.Slice(0, num_decode), alloc, s);
      return AttentionWgmma(q, cache, prompts, scale * 1.4426950408889634f, out, s);
    }
    return AttentionWgmma(q, cache, batch, scale * 1.4426950408889634f, out, s);
  }
  // Decode (one token a sequence) on the small-batch decode kernel (attention_decode.cu).
  if (use_mma && dk == dv && AttentionDecodeServes(q, cache, max_q_len)) {
    AttentionDecode(q, cache, batch, scale * 1.4426950408889634f, out, alloc, s);
    return;
  }
  const int64_t max_rows = static_cast<int64_t>(max_q_len) * group;
  const int rows_per_cta = !use_mma ? kBlockM : max_rows <= kMmaDecodeRows ? kMmaDecodeRows : kMmaPrefillRows;
  const int row_tiles = CeilDiv(max_rows, rows_per_cta);
  // Split-KV for decode-like batches that would leave the GPU under-filled: enough splits for
  // Tuning().attention_split_min_ctas CTAs, each split at least one key tile of max_seq_len.
  const int split_keys = use_mma ? kMmaBlockN : kBlockN;
  int num_splits = 1;
  const int64_t ctas = static_cast<int64_t>(row_tiles) * kv_heads * num_seqs;
  const int min_ctas = Tuning().attention_split_min_ctas;
  if (max_q_len <= 16 && batch.max_seq_len > split_keys && min_ctas > 0 && ctas < min_ctas) {
    const int splits = static_cast<int>(std::min<int64_t>(CeilDiv(min_ctas, ctas), CeilDiv(batch.max_seq_len, split_keys)));
    // As few splits as cover max_seq_len in whole tiles (none left empty at the longest length).
    const int chunk = CeilDiv(CeilDiv(batch.max_seq_len, splits), split_keys) * split_keys;
    num_splits = CeilDiv(batch.max_seq_len, chunk);
  }
  const int64_t merge_rows = q.dim(0) * q.dim(1);
  ScratchBuffer partials(alloc, num_splits > 1 ? merge_rows * num_splits * (dv + 2) * sizeof(float) : 0);
  float* part_o = num_splits > 1 ? partials.as<float>() : nullptr;
  float* part_ml = num_splits > 1 ? part_o + merge_rows * num_splits * dv : nullptr;
  const float scale_log2 = scale * 1.4426950408889634f;

  DispatchAttentionDims(static_cast<int>(dk), static_cast<int>(dv), [&](auto dims) {
    constexpr int kDk = decltype(dims)::kDk, kDv = decltype(dims)::kDv;
    bool launched = false, merged = false;
    if constexpr (decltype(dims)::kMma) {
      if (use_mma) {
        merged = AttentionMma<kDk, kDv>(q, cache, batch, scale_log2, rows_per_cta, row_tiles,
                                        num_splits, part_o, part_ml, out, s);
        launched = true;
      }
    }
    if (!launched) {
      AttentionParams p{q.ptr<bf16_t>(), q.strides[0], q.strides[1], out.ptr<bf16_t>(), out.strides[0],
                        out.strides[1], kc.ptr<bf16_t>(), cache.v.ptr<bf16_t>(),
                        batch.block_tables.ptr<int32_t>(),
                        batch.block_tables.rank() == 2 ? batch.block_tables.dim(1) : 0,
                        batch.query_start.ptr<int32_t>(), batch.seq_lens.ptr<int32_t>(), kv_heads, group,
                        cache.block_size(), scale_log2, row_tiles, num_splits, static_cast<int>(q.dim(1)),
                        part_o, part_ml};
      dim3 grid(row_tiles * num_splits, kv_heads, num_seqs);
      if (shared) {
        if constexpr (kDk != kDv) LaunchAttention<kDk, kDv, true>(p, grid, s);
        else COROLLA_CHECK(false) << "attention: a shared K/V cache needs Dv < Dk";
      } else {
        LaunchAttention<kDk, kDv, false>(p, grid, s);
      }
      COROLLA_CUDA_CHECK_LAUNCH();
    }
    if (num_splits > 1 && !merged) {
      LaunchSplitKvMerge<kDv>({part_o, part_ml, out.ptr<bf16_t>(), out.strides[0], out.strides[1], merge_rows,
                               static_cast<int>(q.dim(1)), num_splits},
                              s);
    }
  });
}

bool FusesDecodePrologue(const AttentionBatch& batch) {
  const int min_keys = Tuning().attention_fused_prologue_min_keys;
  return Tuning().attention_fused_prologue ||
         (min_keys > 0 && batch.seq_lens.numel() <= Tuning().attention_fused_prologue_max_seqs &&
          batch.max_seq_len >= min_keys && !DecodeSplitsCappedToCluster(batch));
}

namespace {

// QkNormRopeAttention in one launch (FusesDecodePrologue); with proj_w the o
// projection folded in as well, or nothing (whatever that knob says).
AttentionResult FusedDecodeAttention(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& q_norm_w, const TensorView& k_norm_w, float eps,
                                     const TensorView& positions, const RopeParams& rope, const float* inv_freq,
                                     const KvCacheView& cache, const AttentionBatch& batch, float scale,
                                     const TensorView& out, const TensorView* proj_w, const TensorView* proj_out,
                                     CachingAllocator& alloc, cudaStream_t s) {
  const int max_q_len = batch.max_q_len > 0 ? batch.max_q_len : static_cast<int>(q.dim(0));
  if (!(FusesDecodePrologue(batch) || proj_w != nullptr) || max_q_len != 1 || q.rank() != 3 ||
      out.rank() != 3 ||
      out.dim(2) != q.dim(2) ||
      !QkNormRopeKvWriteServes(q, k, v, q_norm_w, k_norm_w, positions, rope, cache, batch))
    return AttentionResult::kNone;
  if (!CheckAttention(q, cache, batch, out) || !AttentionDecodeServes(q, cache, max_q_len))
    return AttentionResult::kNone;
  if (q.dim(0) == 0 || batch.seq_lens.numel() == 0)  // nothing to write or attend: the plain path
    return proj_w != nullptr ? AttentionResult::kNone : AttentionResult::kAttention;
  const DecodePrologue prologue{k.ptr<bf16_t>(),
                                k.strides[0],
                                k.strides[1],
                                v.ptr<bf16_t>(),
                                v.strides[0],
                                v.strides[1],
                                q_norm_w.data,
                                k_norm_w.data,
                                q_norm_w.dtype == DType::kF32,
                                k_norm_w.dtype == DType::kF32,
                                eps,
                                positions.ptr<int32_t>(),
                                inv_freq,
                                rope.attention_factor,
                                batch.slot_mapping.ptr<int32_t>(),
                                cache.k.dim(0) * cache.block_size()};
  const bool ran =
      AttentionDecode(q, cache, batch, scale * 1.4426950408889634f, out, alloc, s, &prologue, proj_w, proj_out);
  if (proj_w == nullptr) return AttentionResult::kAttention;
  return ran ? AttentionResult::kProjected : AttentionResult::kNone;
}

}  // namespace

bool QkNormRopeAttention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& q_norm_w,
                         const TensorView& k_norm_w, float eps, const TensorView& positions, const RopeParams& rope,
                         const float* inv_freq, const KvCacheView& cache, const AttentionBatch& batch, float scale,
                         const TensorView& out, CachingAllocator& alloc, cudaStream_t s) {
  const bool folded = FusedDecodeAttention(q, k, v, q_norm_w, k_norm_w, eps, positions, rope, inv_freq, cache, batch,
                                           scale, out, nullptr, nullptr, alloc, s) != AttentionResult::kNone;
  SetStagedGemvBesideFoldedAttention(s, folded);
  return folded;
}

AttentionResult QkNormRopeAttentionProj(const TensorView& q, const TensorView& k, const TensorView& v,
                                        const TensorView& q_norm_w, const TensorView& k_norm_w, float eps,
                                        const TensorView& positions, const RopeParams& rope, const float* inv_freq,
                                        const KvCacheView& cache, const AttentionBatch& batch, float scale,
                                        const TensorView& out, const TensorView& w_o, const TensorView& proj_out,
                                        CachingAllocator& alloc, cudaStream_t s) {
  AttentionResult r = AttentionResult::kNone;
  if (Tuning().attention_region)
    r = FusedDecodeAttention(q, k, v, q_norm_w, k_norm_w, eps, positions, rope, inv_freq, cache, batch, scale, out,
                             &w_o, &proj_out, alloc, s);
  if (r != AttentionResult::kProjected)
    r = FusedDecodeAttention(q, k, v, q_norm_w, k_norm_w, eps, positions, rope, inv_freq, cache, batch, scale, out,
                             nullptr, nullptr, alloc, s);
  SetStagedGemvBesideFoldedAttention(s, r != AttentionResult::kNone);
  return r;
}

}  // namespace corolla::cuda
