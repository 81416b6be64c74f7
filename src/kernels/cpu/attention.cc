// Paged KV write and causal GQA attention over the paged cache on the CPU.
// The cache is heads-major within a block: [num_blocks, Hk, block_size, D].
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/ops.h"

namespace corolla::cpu {
namespace {

float* CacheRow(const TensorView& cache, int64_t block, int64_t head, int64_t offset) {
  return cache.ptr<float>() + block * cache.strides[0] + head * cache.strides[1] +
         offset * cache.strides[2];
}

}  // namespace

void KvWrite(const TensorView& k, const TensorView& v, const KvCacheView& cache,
             const AttentionBatch& batch) {
  COROLLA_CHECK(k.dtype == DType::kF32 && cache.k.dtype == DType::kF32);
  int64_t tokens = k.dim(0), heads = k.dim(1), d = k.dim(2), dv = v.dim(2);
  int bs = cache.block_size();
  const bool shared = cache.k.data == cache.v.data;  // MLA latent: write once
  COROLLA_CHECK(cache.k.dim(1) == heads && cache.k.dim(3) == d && cache.v.dim(3) == dv &&
                batch.slot_mapping.numel() == tokens);
  const int32_t* slots = batch.slot_mapping.ptr<int32_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;  // a padding row (decode graph buckets): no write, as on CUDA
    int64_t block = slots[t] / bs, offset = slots[t] % bs;
    COROLLA_CHECK(block < cache.k.dim(0)) << "slot " << slots[t];
    for (int64_t h = 0; h < heads; ++h) {
      std::memcpy(CacheRow(cache.k, block, h, offset),
                  k.ptr<float>() + t * k.strides[0] + h * k.strides[1], d * sizeof(float));
      if (shared) continue;
      std::memcpy(CacheRow(cache.v, block, h, offset),
                  v.ptr<float>() + t * v.strides[0] + h * v.strides[1], dv * sizeof(float));
    }
  }
}

void Attention(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch,
               float scale, const TensorView& out) {
  COROLLA_CHECK(q.dtype == DType::kF32 && out.dtype == DType::kF32 && cache.k.dtype == DType::kF32);
  int64_t q_heads = q.dim(1), d = q.dim(2), kv_heads = cache.k.dim(1), dv = out.dim(2);
  COROLLA_CHECK(q_heads % kv_heads == 0 && cache.k.dim(3) == d && out.dim(1) == q_heads && dv <= cache.v.dim(3));
  int64_t group = q_heads / kv_heads;
  int64_t num_seqs = batch.seq_lens.numel();
  const int32_t* qstart = batch.query_start.ptr<int32_t>();
  const int32_t* seq_lens = batch.seq_lens.ptr<int32_t>();
  const int32_t* tables = batch.block_tables.ptr<int32_t>();
  int64_t table_stride = batch.block_tables.rank() == 2 ? batch.block_tables.dim(1) : 0;
  int bs = cache.block_size();

  // One work item per (token, kv head): the query heads of a group share the K/V rows.
  int64_t tokens = q.dim(0);
  std::vector<int32_t> seq_of_token(tokens);
  for (int64_t b = 0; b < num_seqs; ++b)
    for (int32_t t = qstart[b]; t < qstart[b + 1]; ++t) seq_of_token[t] = static_cast<int32_t>(b);

  ThreadPool::Default().ParallelFor(tokens * kv_heads, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<double> acc(dv);
    for (int64_t item = begin; item < end; ++item) {
      int64_t t = item / kv_heads, kvh = item % kv_heads;
      int64_t b = seq_of_token[t];
      int64_t q_len = qstart[b + 1] - qstart[b];
      int64_t pos = seq_lens[b] - q_len + (t - qstart[b]);  // this token's position
      int64_t ctx = pos + 1;                                 // causal: keys 0..pos
      const int32_t* table = tables + b * table_stride;
      scores.resize(ctx);
      for (int64_t g = 0; g < group; ++g) {
        int64_t h = kvh * group + g;
        const float* qh = q.ptr<float>() + t * q.strides[0] + h * q.strides[1];
        float max_score = -INFINITY;
        for (int64_t j = 0; j < ctx; ++j) {
          const float* kj = CacheRow(cache.k, table[j / bs], kvh, j % bs);
          float s = 0;
          for (int64_t i = 0; i < d; ++i) s += qh[i] * kj[i];
          scores[j] = s * scale;
          max_score = std::max(max_score, scores[j]);
        }
        double denom = 0;
        for (int64_t j = 0; j < ctx; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          denom += scores[j];
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < ctx; ++j) {
          const float* vj = CacheRow(cache.v, table[j / bs], kvh, j % bs);
          double p = scores[j];
          for (int64_t i = 0; i < dv; ++i) acc[i] += p * vj[i];
        }
        float* o = out.ptr<float>() + t * out.strides[0] + h * out.strides[1];
        for (int64_t i = 0; i < dv; ++i) o[i] = static_cast<float>(acc[i] / denom);
      }
    }
  });
}

}  // namespace corolla::cpu
