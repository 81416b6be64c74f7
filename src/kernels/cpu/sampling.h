// CPU token sampler: the reference twin of the CUDA sampler. Filters follow Hugging Face's
// generate() warpers in its order (temperature, top-k, top-p, min-p), then one inverse-CDF draw
// with u = UniformFromSeed(seed, step) over the kept tokens in sampling order: logit descending,
// ties by lowest id. The token depends only on (logits, params, seed, step).
// Callers own all buffers. Functions are thread-safe (scratch is thread-local); SampleBatch
// uses ThreadPool::Default(), so call it from one thread at a time (the engine's step thread).
//
// Exact semantics, for logits l[V] with NaN read as -inf:
//   greedy (temperature <= 0): argmax, lowest id on ties; no draw.
//   all logits -inf/NaN: token 0, the argmax of that row, for greedy and sampling alike.
//   weights w_i = exp((l_i - max l) / T), so the top token has weight exactly 1; tokens of weight
//     0 (-inf, NaN, or underflow) are never kept. If some logit is +inf, those tokens share the
//     mass equally (the limit) and every other token has weight 0.
//   top-k (k > 0): keep the first k tokens in sampling order; ties at the k-th place are cut by id
//     (HF keeps all tokens tied with the k-th; we keep exactly k).
//   top-p (0 <= p < 1): with Z the mass left by top-k and S_i the mass of the tokens before the
//     i-th in sampling order, keep token i iff S_i < p * Z; the first token is always kept. This
//     is HF's rule (drop while the ascending cumulative sum <= 1 - p) in exact arithmetic: the
//     smallest prefix whose mass reaches p, and a prefix summing to exactly p stops there.
//   min-p (p > 0): keep tokens with w_i >= min(p, 1) * max w, i.e. HF's "prob < min_p * top prob
//     is removed"; the ratio is the same before or after the earlier filters renormalise.
//   draw: target = u * (mass kept); the first kept token in sampling order whose cumulative
//     mass exceeds target. Sums are in double.
#pragma once

#include <cstdint>

#include "kernels/sampling.h"

namespace corolla::cpu {

// Samples one token from logits[vocab] with params; `step` selects the draw of the request's
// random stream.
int32_t SampleToken(const float* logits, int64_t vocab, const SamplingParams& params,
                    uint64_t step);

// The distribution SampleToken draws from (after temperature, top-k, top-p, min-p), for tests and
// logprobs: writes probs[vocab], 0 outside the kept set. Greedy rows get a one-hot.
void SamplingDistribution(const float* logits, int64_t vocab, const SamplingParams& params,
                          float* probs);

// log-softmax of raw logits (no temperature), for logprobs; NaN reads as -inf, and a row that
// is all -inf gives all -inf.
void LogSoftmax(const float* logits, int64_t vocab, float* out);

// One token per row: logits [batch, vocab] contiguous, params [batch], steps [batch],
// out [batch]. Rows run in parallel; each row's token equals SampleToken on that row alone.
void SampleBatch(const float* logits, int64_t batch, int64_t vocab, const SamplingParams* params,
                 const uint64_t* steps, int32_t* out);

// GatherRows for token ids: out[i] = x[rows[i]], x [T, 1] i32, rows [N] i32, out [N, 1] i32. The
// engine builds a step's input ids from the ids the previous step sampled this way.
void GatherIds(const TensorView& x, const TensorView& rows, const TensorView& out);

}  // namespace corolla::cpu
