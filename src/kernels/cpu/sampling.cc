// CPU token sampler; the semantics are spelled out in sampling.h. Cost per row is O(V) plus the
// sorting the row needs: top-k sorts only k tokens (after nth_element), and otherwise tokens are
// bucketed by the binary exponent of their weight and a bucket is sorted only when a walk in
// sampling order reaches it, so the likely tokens at the head get sorted and the long tail
// usually does not.
#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/check.h"
#include "base/numeric.h"
#include "base/thread_pool.h"

namespace corolla::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
constexpr float kMinPositive = std::numeric_limits<float>::denorm_min();
// Weights lie in (0, 1]; bucket b holds weights with biased exponent in (125 - 2b, 127 - 2b],
// i.e. two binades per bucket, and the last bucket also takes every smaller weight.
constexpr int kNumBuckets = 64;

inline int WeightBucket(float w) {
  int biased_exponent = static_cast<int>(FloatBits(w) >> 23);  // sign is 0; 127 for w = 1
  return std::min((127 - biased_exponent) >> 1, kNumBuckets - 1);
}

bool IsGreedy(const SamplingParams& params) { return !(params.temperature > 0.0f); }  // NaN too

// Index of the largest logit, the lowest on ties; NaN never wins; 0 when all are -inf/NaN.
int32_t Argmax(const float* logits, int64_t vocab) {
  int64_t best = 0;
  float best_value = kNegInf;
  for (int64_t i = 0; i < vocab; ++i) {
    if (logits[i] > best_value) {  // false for NaN
      best_value = logits[i];
      best = i;
    }
  }
  return static_cast<int32_t>(best);
}

float MaxLogit(const float* logits, int64_t vocab) {
  float max_value = kNegInf;
  for (int64_t i = 0; i < vocab; ++i) max_value = logits[i] > max_value ? logits[i] : max_value;
  return max_value;
}

struct WeightSummary {
  double mass = 0.0;         // sum of all weights, in id order
  int64_t num_positive = 0;  // tokens of weight > 0
};

// weights[i] = exp((l_i - max l) / T); 0 for -inf/NaN; with +inf logits, 1 for those only.
WeightSummary ComputeWeights(const float* logits, int64_t vocab, float temperature,
                             float* weights) {
  float max_logit = MaxLogit(logits, vocab);
  WeightSummary summary;
  for (int64_t i = 0; i < vocab; ++i) {
    float v = logits[i];
    float w;
    if (max_logit == kPosInf) {
      w = v == kPosInf ? 1.0f : 0.0f;
    } else if (!(v > kNegInf)) {  // -inf or NaN
      w = 0.0f;
    } else {
      w = std::exp((v - max_logit) / temperature);
    }
    weights[i] = w;
    summary.mass += w;
    summary.num_positive += w > 0.0f;
  }
  return summary;
}

// Tokens in sampling order (logit descending, ties by lowest id), materialised into `ids` by
// one of the Select* calls and sorted lazily bucket by bucket as at() walks forward.
class OrderedTokens {
 public:
  OrderedTokens(const float* logits, const float* weights, std::vector<int32_t>* ids)
      : logits_(logits), weights_(weights), ids_(ids) {}

  // Every token of weight >= floor (floor > 0). Returns their mass, summed in id order.
  double SelectAtLeast(int64_t vocab, float floor) {
    int64_t counts[kNumBuckets] = {};
    double mass = 0.0;
    for (int64_t i = 0; i < vocab; ++i) {
      float w = weights_[i];
      if (w >= floor) {
        ++counts[WeightBucket(w)];
        mass += w;
      }
    }
    bucket_start_[0] = 0;
    for (int b = 0; b < kNumBuckets; ++b) bucket_start_[b + 1] = bucket_start_[b] + counts[b];
    size_ = bucket_start_[kNumBuckets];
    ids_->resize(size_);
    int64_t cursor[kNumBuckets];
    std::copy(bucket_start_, bucket_start_ + kNumBuckets, cursor);
    for (int64_t i = 0; i < vocab; ++i) {
      float w = weights_[i];
      if (w >= floor) (*ids_)[cursor[WeightBucket(w)]++] = static_cast<int32_t>(i);
    }
    next_bucket_ = 0;
    sorted_end_ = 0;
    return mass;
  }

  // The first k tokens in sampling order among those of positive weight (all of them if fewer).
  // Only buckets up to the one where the count reaches k can hold them (a token in a later
  // bucket has a smaller weight, so a smaller logit, than at least k others), so nth_element
  // runs on those alone.
  void SelectTopK(int64_t vocab, int64_t k) {
    int64_t counts[kNumBuckets] = {};
    for (int64_t i = 0; i < vocab; ++i) {
      if (weights_[i] > 0.0f) ++counts[WeightBucket(weights_[i])];
    }
    int last_bucket = 0;
    for (int64_t seen = counts[0]; seen < k && last_bucket + 1 < kNumBuckets;) {
      seen += counts[++last_bucket];
    }
    ids_->clear();
    for (int64_t i = 0; i < vocab; ++i) {
      float w = weights_[i];
      if (w > 0.0f && WeightBucket(w) <= last_bucket) ids_->push_back(static_cast<int32_t>(i));
    }
    auto before = [this](int32_t a, int32_t b) { return Before(a, b); };
    if (k < static_cast<int64_t>(ids_->size())) {
      std::nth_element(ids_->begin(), ids_->begin() + k, ids_->end(), before);
      ids_->resize(k);
    }
    std::sort(ids_->begin(), ids_->end(), before);
    size_ = static_cast<int64_t>(ids_->size());
    next_bucket_ = kNumBuckets;
    sorted_end_ = size_;
  }

  int64_t size() const { return size_; }

  // The i-th token in sampling order, i < size().
  int32_t at(int64_t i) {
    while (i >= sorted_end_) {
      COROLLA_CHECK_LT(next_bucket_, kNumBuckets);
      auto first = ids_->begin() + bucket_start_[next_bucket_];
      auto last = ids_->begin() + bucket_start_[next_bucket_ + 1];
      std::sort(first, last, [this](int32_t a, int32_t b) { return Before(a, b); });
      sorted_end_ = bucket_start_[++next_bucket_];
    }
    return (*ids_)[i];
  }

 private:
  // Only tokens of positive weight are compared, so no logit here is NaN.
  bool Before(int32_t a, int32_t b) const {
    return logits_[a] > logits_[b] || (logits_[a] == logits_[b] && a < b);
  }

  const float* logits_;
  const float* weights_;
  std::vector<int32_t>* ids_;
  int64_t bucket_start_[kNumBuckets + 1] = {};
  int64_t size_ = 0;
  int next_bucket_ = 0;
  int64_t sorted_end_ = 0;
};

// The kept set: the first `count` tokens of the OrderedTokens, of total weight `mass`. When
// `all_selected`, it is every selected token and the order has not been forced (no sort yet).
struct KeptSet {
  int64_t count = 0;
  double mass = 0.0;
  bool all_selected = false;
  float floor = kMinPositive;  // min-p weight threshold
};

KeptSet ApplyFilters(int64_t vocab, const SamplingParams& params, const float* weights,
                     const WeightSummary& summary, OrderedTokens* order) {
  KeptSet kept;
  // The top token has weight exactly 1, so a floor <= 1 always keeps it.
  if (params.min_p > 0.0f) kept.floor = std::max(std::min(params.min_p, 1.0f), kMinPositive);
  bool use_top_p = params.top_p < 1.0f;
  double mass_before_top_p = summary.mass;
  if (params.top_k > 0 && params.top_k < summary.num_positive) {
    order->SelectTopK(vocab, params.top_k);
    mass_before_top_p = 0.0;
    for (int64_t i = 0; i < order->size(); ++i) mass_before_top_p += weights[order->at(i)];
  } else {
    double mass = order->SelectAtLeast(vocab, kept.floor);
    if (!use_top_p) {
      kept.count = order->size();
      kept.mass = mass;
      kept.all_selected = true;
      return kept;
    }
  }
  // One walk in sampling order: top-p stops at the first token whose predecessors already hold
  // p of the mass; min-p stops at the first token under the floor (both cut a prefix, so their
  // intersection is the shorter prefix). The first token always stays.
  double top_p_limit = use_top_p ? static_cast<double>(params.top_p) * mass_before_top_p
                                 : static_cast<double>(kPosInf);
  double cumulative = 0.0;
  int64_t i = 0;
  for (; i < order->size(); ++i) {
    float w = weights[order->at(i)];
    if (w < kept.floor) break;
    if (i > 0 && cumulative >= top_p_limit) break;
    cumulative += w;
  }
  kept.count = i;
  kept.mass = cumulative;
  return kept;
}

// Per-thread scratch, grown to the largest vocabulary seen.
struct RowScratch {
  std::vector<float> weights;
  std::vector<int32_t> ids;
};

RowScratch& ThreadScratch() {
  thread_local RowScratch scratch;
  return scratch;
}

}  // namespace

int32_t SampleToken(const float* logits, int64_t vocab, const SamplingParams& params,
                    uint64_t step) {
  COROLLA_CHECK(vocab > 0) << "vocab " << vocab;
  if (IsGreedy(params)) return Argmax(logits, vocab);
  RowScratch& scratch = ThreadScratch();
  scratch.weights.resize(vocab);
  WeightSummary summary = ComputeWeights(logits, vocab, params.temperature, scratch.weights.data());
  if (summary.num_positive == 0) return 0;  // all -inf/NaN: the argmax of such a row
  OrderedTokens order(logits, scratch.weights.data(), &scratch.ids);
  KeptSet kept = ApplyFilters(vocab, params, scratch.weights.data(), summary, &order);
  COROLLA_CHECK(kept.count > 0);

  double target = static_cast<double>(UniformFromSeed(params.seed, step)) * kept.mass;
  double cumulative = 0.0;
  for (int64_t i = 0; i < kept.count; ++i) {
    int32_t id = order.at(i);
    cumulative += scratch.weights[id];
    if (target < cumulative) return id;
  }
  return order.at(kept.count - 1);  // rounding left target at the very end of the mass
}

void SamplingDistribution(const float* logits, int64_t vocab, const SamplingParams& params,
                          float* probs) {
  COROLLA_CHECK(vocab > 0) << "vocab " << vocab;
  std::fill(probs, probs + vocab, 0.0f);
  if (IsGreedy(params)) {
    probs[Argmax(logits, vocab)] = 1.0f;
    return;
  }
  RowScratch& scratch = ThreadScratch();
  scratch.weights.resize(vocab);
  const float* weights = scratch.weights.data();
  WeightSummary summary = ComputeWeights(logits, vocab, params.temperature, scratch.weights.data());
  if (summary.num_positive == 0) {
    probs[0] = 1.0f;
    return;
  }
  OrderedTokens order(logits, weights, &scratch.ids);
  KeptSet kept = ApplyFilters(vocab, params, weights, summary, &order);
  if (kept.all_selected) {  // no need to order the tokens: every one above the floor is kept
    for (int64_t i = 0; i < vocab; ++i) {
      if (weights[i] >= kept.floor) probs[i] = static_cast<float>(weights[i] / kept.mass);
    }
    return;
  }
  for (int64_t i = 0; i < kept.count; ++i) {
    int32_t id = order.at(i);
    probs[id] = static_cast<float>(weights[id] / kept.mass);
  }
}

void LogSoftmax(const float* logits, int64_t vocab, float* out) {
  float max_logit = MaxLogit(logits, vocab);
  if (max_logit == kNegInf) {
    std::fill(out, out + vocab, kNegInf);
    return;
  }
  if (max_logit == kPosInf) {  // the +inf tokens share all the mass
    int64_t num_inf = std::count(logits, logits + vocab, kPosInf);
    float log_share = -std::log(static_cast<float>(num_inf));
    for (int64_t i = 0; i < vocab; ++i) out[i] = logits[i] == kPosInf ? log_share : kNegInf;
    return;
  }
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (logits[i] > kNegInf) sum += std::exp(static_cast<double>(logits[i] - max_logit));
  }
  float log_sum = static_cast<float>(std::log(sum));
  for (int64_t i = 0; i < vocab; ++i) {
    out[i] = logits[i] > kNegInf ? (logits[i] - max_logit) - log_sum : kNegInf;
  }
}

void SampleBatch(const float* logits, int64_t batch, int64_t vocab, const SamplingParams* params,
                 const uint64_t* steps, int32_t* out) {
  ThreadPool::Default().ParallelFor(batch, /*grain=*/1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      out[b] = SampleToken(logits + b * vocab, vocab, params[b], steps[b]);
    }
  });
}

void GatherIds(const TensorView& x, const TensorView& rows, const TensorView& out) {
  COROLLA_CHECK(x.dtype == DType::kI32 && out.dtype == DType::kI32 && rows.dtype == DType::kI32 &&
                x.rank() == 2 && out.rank() == 2 && x.dim(1) == 1 && out.dim(1) == 1 &&
                rows.numel() == out.dim(0) && rows.is_contiguous())
      << "gather ids x " << x.ToString() << " rows " << rows.ToString() << " out " << out.ToString();
  for (int64_t i = 0; i < out.dim(0); ++i) {
    const int32_t r = rows.ptr<int32_t>()[i];
    COROLLA_CHECK(r >= 0 && r < x.dim(0)) << "gather ids: row " << r << " of " << x.dim(0);
    out.ptr<int32_t>()[i * out.strides[0]] = x.ptr<int32_t>()[r * x.strides[0]];
  }
}

}  // namespace corolla::cpu
