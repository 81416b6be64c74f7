// Tests of Philox4x32-10 and the CPU sampler: known-answer vectors, determinism, exact kept sets
// against a full-sort reference written from the definitions in sampling.h, and chi-square
// goodness-of-fit of sampled tokens against SamplingDistribution.
#include "kernels/cpu/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

namespace corolla::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

SamplingParams Params(float temperature, int top_k = 0, float top_p = 1.0f, float min_p = 0.0f,
                      uint64_t seed = 0) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = seed;
  return p;
}

std::vector<float> Distribution(const std::vector<float>& logits, const SamplingParams& params) {
  std::vector<float> probs(logits.size(), -1.0f);  // poisoned: every entry must be written
  SamplingDistribution(logits.data(), static_cast<int64_t>(logits.size()), params, probs.data());
  return probs;
}

std::vector<int32_t> Support(const std::vector<float>& probs) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] > 0.0f) ids.push_back(static_cast<int32_t>(i));
  }
  return ids;
}

// ---- reference sampler: full sort, straight from the definitions in sampling.h --------------
// It mirrors the float expression of the weights and the order of every sum, so kept sets,
// probabilities and drawn tokens must agree exactly with the fast path.
struct Reference {
  std::vector<int32_t> kept;  // sampling order
  std::vector<float> weights;
  double mass = 0.0;
};

Reference ReferenceKeep(const std::vector<float>& logits, const SamplingParams& params) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  Reference ref;
  ref.weights.assign(vocab, 0.0f);
  float max_logit = -kInf;
  for (float v : logits) {
    if (v > max_logit) max_logit = v;
  }
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    float v = logits[i];
    if (max_logit == kInf) {
      ref.weights[i] = v == kInf ? 1.0f : 0.0f;
    } else if (v > -kInf) {
      ref.weights[i] = std::exp((v - max_logit) / params.temperature);
    }
    total += ref.weights[i];
  }
  std::vector<int32_t> order;
  for (int64_t i = 0; i < vocab; ++i) {
    if (ref.weights[i] > 0.0f) order.push_back(static_cast<int32_t>(i));
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  double mass_before_top_p = total;
  bool top_k_active = params.top_k > 0 && params.top_k < static_cast<int64_t>(order.size());
  if (top_k_active) {
    order.resize(params.top_k);
    mass_before_top_p = 0.0;
    for (int32_t id : order) mass_before_top_p += ref.weights[id];
  }
  float floor =
      params.min_p > 0.0f ? std::min(params.min_p, 1.0f) : std::numeric_limits<float>::denorm_min();
  double limit = params.top_p < 1.0f ? params.top_p * mass_before_top_p : 1e300;
  double cumulative = 0.0;
  for (size_t i = 0; i < order.size(); ++i) {
    float w = ref.weights[order[i]];
    if (w < floor || (i > 0 && cumulative >= limit)) break;
    ref.kept.push_back(order[i]);
    cumulative += w;
  }
  ref.mass = cumulative;
  if (!top_k_active && !(params.top_p < 1.0f)) {  // nothing walked: the mass is summed by id
    ref.mass = 0.0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (ref.weights[i] >= floor) ref.mass += ref.weights[i];
    }
  }
  return ref;
}

int32_t ReferenceSample(const Reference& ref, const SamplingParams& params, uint64_t step) {
  double target = static_cast<double>(UniformFromSeed(params.seed, step)) * ref.mass;
  double cumulative = 0.0;
  for (int32_t id : ref.kept) {
    cumulative += ref.weights[id];
    if (target < cumulative) return id;
  }
  return ref.kept.back();
}

void ExpectMatchesReference(const std::vector<float>& logits, const SamplingParams& params,
                            int num_steps) {
  SCOPED_TRACE(testing::Message() << "T=" << params.temperature << " k=" << params.top_k
                                  << " p=" << params.top_p << " min_p=" << params.min_p);
  Reference ref = ReferenceKeep(logits, params);
  std::vector<float> probs = Distribution(logits, params);
  std::vector<int32_t> expected_support = ref.kept;
  std::sort(expected_support.begin(), expected_support.end());
  ASSERT_EQ(Support(probs), expected_support);
  for (int32_t id : ref.kept) {
    EXPECT_FLOAT_EQ(probs[id], static_cast<float>(ref.weights[id] / ref.mass)) << "token " << id;
  }
  const int64_t vocab = static_cast<int64_t>(logits.size());
  for (int step = 0; step < num_steps; ++step) {
    ASSERT_EQ(SampleToken(logits.data(), vocab, params, step), ReferenceSample(ref, params, step))
        << "step " << step;
  }
}

// ---- chi-square machinery -----------------------------------------------------------------

// Regularised upper incomplete gamma Q(a, x): the series of P for x < a + 1, else a continued
// fraction evaluated with the modified Lentz method.
double RegularizedGammaQ(double a, double x) {
  if (x <= 0.0) return 1.0;
  double log_prefix = a * std::log(x) - x - std::lgamma(a);
  if (x < a + 1.0) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000; ++n) {
      term *= x / (a + n);
      sum += term;
      if (term < sum * 1e-16) break;
    }
    return std::max(0.0, 1.0 - sum * std::exp(log_prefix));
  }
  constexpr double kTiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / kTiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = b + an / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < 1e-16) break;
  }
  return std::exp(log_prefix) * h;
}

// P(X >= statistic) for X ~ chi-square with `dof` degrees of freedom.
double ChiSquarePValue(double statistic, int dof) {
  return RegularizedGammaQ(0.5 * dof, 0.5 * statistic);
}

struct FitResult {
  double p_value = 0.0;
  int64_t outside_support = 0;  // samples of tokens the distribution gives probability 0
};

// Pearson's test of counts[] (num_samples draws) against probs[]. Cells expected to hold fewer
// than 5 samples are pooled into one cell.
FitResult GoodnessOfFit(const std::vector<int64_t>& counts, const std::vector<float>& probs,
                        int64_t num_samples) {
  FitResult result;
  double statistic = 0.0, pooled_expected = 0.0;
  int64_t pooled_observed = 0;
  int num_cells = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) {
      result.outside_support += counts[i];
      continue;
    }
    double expected = probs[i] * static_cast<double>(num_samples);
    if (expected < 5.0) {
      pooled_expected += expected;
      pooled_observed += counts[i];
      continue;
    }
    double diff = counts[i] - expected;
    statistic += diff * diff / expected;
    ++num_cells;
  }
  if (pooled_expected > 0.0) {
    double diff = pooled_observed - pooled_expected;
    statistic += diff * diff / pooled_expected;
    ++num_cells;
  }
  result.p_value = num_cells > 1 ? ChiSquarePValue(statistic, num_cells - 1) : 1.0;
  return result;
}

std::vector<int64_t> DrawCounts(const std::vector<float>& logits, const SamplingParams& params,
                                int64_t num_samples) {
  std::vector<int64_t> counts(logits.size(), 0);
  for (int64_t step = 0; step < num_samples; ++step) {
    int32_t id = SampleToken(logits.data(), static_cast<int64_t>(logits.size()), params,
                             static_cast<uint64_t>(step));
    EXPECT_GE(id, 0);
    EXPECT_LT(id, static_cast<int32_t>(logits.size()));
    ++counts[id];
  }
  return counts;
}

// 16 tokens: a tie at the top (ids 2, 6), a tie (ids 5, 11) that top_k = 5 splits, a -inf and
// a NaN that must never be drawn.
const std::vector<float> kFitLogits = {1.2f, -0.5f, 2.0f,  0.3f, -1.7f, 0.9f, 2.0f, -3.0f,
                                       0.0f, 1.5f,  -kInf, 0.9f, -0.9f, kNaN, 0.6f, -2.2f};
constexpr int64_t kNumFitSamples = 200000;

// ---- Philox --------------------------------------------------------------------------------

TEST(PhiloxTest, KnownAnswerVectors) {
  // Random123 tests/kat_vectors, "philox4x32 10": counter words c0..c3, key words k0, k1, output.
  struct Vector {
    uint32_t ctr[4], key[2], out[4];
  };
  const Vector vectors[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Vector& v : vectors) {
    uint64_t counter_lo = v.ctr[0] | (static_cast<uint64_t>(v.ctr[1]) << 32);
    uint64_t counter_hi = v.ctr[2] | (static_cast<uint64_t>(v.ctr[3]) << 32);
    uint64_t key = v.key[0] | (static_cast<uint64_t>(v.key[1]) << 32);
    uint32_t out[4] = {};
    Philox4x32(key, counter_hi, counter_lo, out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], v.out[i]) << "word " << i << " key " << key;
  }
}

TEST(PhiloxTest, UniformIsTop24BitsOfFirstWord) {
  for (uint64_t seed : {0ull, 1ull, 0xdeadbeefcafef00dull}) {
    for (uint64_t step : {0ull, 1ull, 12345ull, 0xffffffffffull}) {
      uint32_t words[4];
      Philox4x32(seed, 0, step, words);
      float u = UniformFromSeed(seed, step);
      EXPECT_EQ(u, static_cast<float>(words[0] >> 8) / 16777216.0f);
      EXPECT_GE(u, 0.0f);
      EXPECT_LT(u, 1.0f);
    }
  }
  // Key 0, counter 0 is the first known-answer vector: 0x6627e8d5 >> 8 = 0x6627e8.
  EXPECT_EQ(UniformFromSeed(0, 0), static_cast<float>(0x6627e8) / 16777216.0f);
}

TEST(PhiloxTest, UniformPassesChiSquare) {
  constexpr int kBins = 64;
  constexpr int64_t kDraws = 200000;
  std::vector<int64_t> counts(kBins, 0);
  for (int64_t step = 0; step < kDraws; ++step)
    ++counts[static_cast<int>(UniformFromSeed(7, step) * kBins)];
  FitResult fit = GoodnessOfFit(counts, std::vector<float>(kBins, 1.0f / kBins), kDraws);
  EXPECT_GT(fit.p_value, 1e-4);
}

// ---- chi-square helper itself ---------------------------------------------------------------

TEST(ChiSquareTest, PValuesMatchTables) {
  EXPECT_NEAR(ChiSquarePValue(3.841459, 1), 0.05, 1e-6);
  EXPECT_NEAR(ChiSquarePValue(18.307038, 10), 0.05, 1e-6);
  EXPECT_NEAR(ChiSquarePValue(6.634897, 1), 0.01, 1e-6);
  EXPECT_NEAR(ChiSquarePValue(124.342113, 100), 0.05, 1e-6);
  for (double x : {0.1, 1.0, 5.0, 40.0})
    EXPECT_NEAR(ChiSquarePValue(x, 2), std::exp(-x / 2), 1e-12);
  EXPECT_LT(ChiSquarePValue(200.0, 10), 1e-30);
}

// ---- greedy ---------------------------------------------------------------------------------

TEST(SamplingTest, GreedyIsArgmaxLowestIdOnTies) {
  std::vector<float> logits = {0.5f, 3.0f, kNaN, 3.0f, -1.0f, 3.0f};
  for (float temperature : {0.0f, -1.0f}) {
    SamplingParams params = Params(temperature, /*top_k=*/2, /*top_p=*/0.5f, 0.0f, /*seed=*/99);
    for (uint64_t step = 0; step < 5; ++step)
      EXPECT_EQ(SampleToken(logits.data(), 6, params, step), 1);
    std::vector<float> probs = Distribution(logits, params);
    EXPECT_EQ(probs, (std::vector<float>{0, 1, 0, 0, 0, 0}));
  }
  std::vector<float> nan_first = {kNaN, -2.0f, -1.0f};
  EXPECT_EQ(SampleToken(nan_first.data(), 3, Params(0.0f), 0), 2);
}

TEST(SamplingTest, AllNegativeInfinityOrNaNGivesTokenZero) {
  std::vector<float> logits = {-kInf, kNaN, -kInf, kNaN};
  for (float temperature : {0.0f, 1.0f}) {
    for (uint64_t step = 0; step < 10; ++step) {
      EXPECT_EQ(SampleToken(logits.data(), 4, Params(temperature, 2, 0.9f, 0.1f, step), step), 0);
    }
    EXPECT_EQ(Distribution(logits, Params(temperature)), (std::vector<float>{1, 0, 0, 0}));
  }
}

TEST(SamplingTest, PositiveInfinityLogitsShareTheMass) {
  std::vector<float> logits = {1.0f, kInf, 3.0f, kInf, kNaN};
  std::vector<float> probs = Distribution(logits, Params(1.0f));
  EXPECT_EQ(probs, (std::vector<float>{0, 0.5f, 0, 0.5f, 0}));
  for (uint64_t step = 0; step < 100; ++step) {
    int32_t id = SampleToken(logits.data(), 5, Params(1.0f, 0, 1.0f, 0.0f, 3), step);
    EXPECT_TRUE(id == 1 || id == 3) << id;
  }
}

// ---- determinism ----------------------------------------------------------------------------

TEST(SamplingTest, SameSeedAndStepGiveSameToken) {
  std::vector<float> logits(16, 0.0f);  // flat: any change of u changes the token
  std::vector<int32_t> seq_a, seq_a_again, seq_b;
  for (uint64_t step = 0; step < 64; ++step) {
    seq_a.push_back(SampleToken(logits.data(), 16, Params(1.0f, 0, 1.0f, 0.0f, 1), step));
    seq_a_again.push_back(SampleToken(logits.data(), 16, Params(1.0f, 0, 1.0f, 0.0f, 1), step));
    seq_b.push_back(SampleToken(logits.data(), 16, Params(1.0f, 0, 1.0f, 0.0f, 2), step));
  }
  EXPECT_EQ(seq_a, seq_a_again);
  EXPECT_NE(seq_a, seq_b);
  // Steps index the stream: consecutive draws of one seed vary.
  EXPECT_GT(std::set<int32_t>(seq_a.begin(), seq_a.end()).size(), 8u);
}

TEST(SamplingTest, BatchEqualsRowsWhateverTheBatch) {
  constexpr int64_t kBatch = 48, kVocab = 3000;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(kBatch * kVocab);
  for (float& v : logits) v = normal(rng);
  std::vector<SamplingParams> params(kBatch);
  std::vector<uint64_t> steps(kBatch);
  for (int64_t b = 0; b < kBatch; ++b) {
    params[b] = Params(b % 7 == 0 ? 0.0f : 0.5f + 0.1f * (b % 9), (b % 3) * 20,
                       b % 4 == 0 ? 1.0f : 0.8f, b % 5 == 0 ? 0.05f : 0.0f, 1000 + b);
    steps[b] = 17 * b;
  }
  std::vector<int32_t> out(kBatch, -1);
  SampleBatch(logits.data(), kBatch, kVocab, params.data(), steps.data(), out.data());
  for (int64_t b = 0; b < kBatch; ++b) {
    EXPECT_EQ(out[b], SampleToken(logits.data() + b * kVocab, kVocab, params[b], steps[b])) << b;
  }
  // Reverse the rows and drop half of them: each row keeps its token.
  constexpr int64_t kSub = kBatch / 2;
  std::vector<float> sub_logits;
  std::vector<SamplingParams> sub_params;
  std::vector<uint64_t> sub_steps;
  std::vector<int64_t> source;
  for (int64_t b = kBatch - 1; b >= 0; b -= 2) {
    source.push_back(b);
    sub_logits.insert(sub_logits.end(), logits.begin() + b * kVocab,
                      logits.begin() + (b + 1) * kVocab);
    sub_params.push_back(params[b]);
    sub_steps.push_back(steps[b]);
  }
  std::vector<int32_t> sub_out(kSub, -1);
  SampleBatch(sub_logits.data(), kSub, kVocab, sub_params.data(), sub_steps.data(), sub_out.data());
  for (int64_t i = 0; i < kSub; ++i) EXPECT_EQ(sub_out[i], out[source[i]]) << "row " << source[i];
}

// ---- exact kept sets ------------------------------------------------------------------------

TEST(SamplingTest, TopKKeepsExactlyKLowestIdsOnTies) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> level(0, 9);  // many ties
  std::vector<float> logits(1000);
  for (float& v : logits) v = static_cast<float>(level(rng));
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  for (int k : {1, 7, 50, 999, 1000, 5000}) {
    std::vector<int32_t> support = Support(Distribution(logits, Params(1.0f, k)));
    std::vector<int32_t> expected(order.begin(), order.begin() + std::min<size_t>(k, order.size()));
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(support, expected) << "k=" << k;
    ExpectMatchesReference(logits, Params(1.0f, k, 1.0f, 0.0f, 4), 50);
  }
}

TEST(SamplingTest, TopPBoundary) {
  // Four equal tokens, 0.25 each (exact in binary). The prefix of two holds exactly 0.5, so
  // top_p = 0.5 keeps two (HF: the third token's ascending cumulative 0.5 <= 1 - 0.5 is dropped).
  std::vector<float> flat(4, 0.0f);
  EXPECT_EQ(Support(Distribution(flat, Params(1.0f, 0, 0.5f))), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(Support(Distribution(flat, Params(1.0f, 0, std::nextafter(0.5f, 1.0f)))),
            (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(Support(Distribution(flat, Params(1.0f, 0, 0.25f))), (std::vector<int32_t>{0}));
  EXPECT_EQ(Support(Distribution(flat, Params(1.0f, 0, 0.0f))), (std::vector<int32_t>{0}));
  EXPECT_EQ(Support(Distribution(flat, Params(1.0f, 0, 0.999f))),
            (std::vector<int32_t>{0, 1, 2, 3}));
  std::vector<float> flat8(8, 1.0f);
  EXPECT_EQ(Support(Distribution(flat8, Params(1.0f, 0, 0.375f))), (std::vector<int32_t>{0, 1, 2}));

  // softmax([2, 1, 0, -1]) = [0.6439, 0.2369, 0.0871, 0.0321]; prefix sums 0.6439, 0.8808, 0.9679.
  std::vector<float> logits = {-1.0f, 2.0f, 0.0f, 1.0f};  // ids in sampling order: 1, 3, 2, 0
  EXPECT_EQ(Support(Distribution(logits, Params(1.0f, 0, 0.60f))), (std::vector<int32_t>{1}));
  EXPECT_EQ(Support(Distribution(logits, Params(1.0f, 0, 0.65f))), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(Support(Distribution(logits, Params(1.0f, 0, 0.88f))), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(Support(Distribution(logits, Params(1.0f, 0, 0.89f))), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(Support(Distribution(logits, Params(1.0f, 0, 0.97f))),
            (std::vector<int32_t>{0, 1, 2, 3}));
  // After top-k = 2 the mass renormalises to [0.7311, 0.2689]: top-p sees that distribution.
  EXPECT_EQ(Support(Distribution(logits, Params(1.0f, 0, 0.70f))), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(Support(Distribution(logits, Params(1.0f, 2, 0.70f))), (std::vector<int32_t>{1}));
  EXPECT_EQ(Support(Distribution(logits, Params(1.0f, 2, 0.75f))), (std::vector<int32_t>{1, 3}));
  // Temperature comes first: at T = 0.5, softmax([4, 2, 0, -2]) has 0.8650 on the top token.
  EXPECT_EQ(Support(Distribution(logits, Params(0.5f, 0, 0.85f))), (std::vector<int32_t>{1}));
}

TEST(SamplingTest, MinPThreshold) {
  // Weights exp(l - max): 1, 0.5016, 0.4966, 0.1003, 0.0993.
  std::vector<float> logits = {0.0f, -0.69f, -0.70f, -2.30f, -2.31f};
  EXPECT_EQ(Support(Distribution(logits, Params(1.0f, 0, 1.0f, 0.5f))),
            (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(Support(Distribution(logits, Params(1.0f, 0, 1.0f, 0.1f))),
            (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(Support(Distribution(logits, Params(1.0f, 0, 1.0f, 1.0f))), (std::vector<int32_t>{0}));
  EXPECT_EQ(Support(Distribution(logits, Params(1.0f, 0, 1.0f, 5.0f))), (std::vector<int32_t>{0}));
  // Temperature first: at T = 2 the weights are exp(l / 2): 1, 0.708, 0.705, 0.317, 0.315.
  EXPECT_EQ(Support(Distribution(logits, Params(2.0f, 0, 1.0f, 0.5f))),
            (std::vector<int32_t>{0, 1, 2}));
  // Ties with the top token all stay at min_p = 1, with or without a walk in sampling order.
  std::vector<float> tied = {3.0f, 1.0f, 3.0f};
  EXPECT_EQ(Support(Distribution(tied, Params(1.0f, 0, 1.0f, 1.0f))), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(Support(Distribution(tied, Params(1.0f, 3, 0.99f, 1.0f))),
            (std::vector<int32_t>{0, 2}));
  // A weight exactly equal to min_p * max stays (HF drops only prob < min_p * top prob). The
  // top logit is 0 and T = 1, so token 2's weight is exactly std::exp(-0.7f).
  float exact_min_p = std::exp(-0.7f);
  EXPECT_EQ(Support(Distribution(logits, Params(1.0f, 0, 1.0f, exact_min_p))),
            (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(Support(Distribution(logits, Params(1.0f, 5, 1.0f, exact_min_p))),
            (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(Support(Distribution(logits, Params(1.0f, 0, 1.0f, std::nextafter(exact_min_p, 1.0f)))),
            (std::vector<int32_t>{0, 1}));
  // Renormalised probabilities over the kept set.
  std::vector<float> probs = Distribution(logits, Params(1.0f, 0, 1.0f, 0.5f));
  EXPECT_NEAR(probs[0], 1.0 / (1.0 + std::exp(-0.69)), 1e-6);
}

TEST(SamplingTest, CombinedFiltersMatchReference) {
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::uniform_int_distribution<int> coarse(-8, 8);
  const SamplingParams configs[] = {
      Params(1.0f),
      Params(0.7f, 5),
      Params(1.3f, 0, 0.9f),
      Params(1.0f, 0, 1.0f, 0.05f),
      Params(0.8f, 40, 0.95f, 0.02f),
      Params(1.5f, 3, 0.5f, 0.3f),
      Params(0.6f, 0, 0.3f, 0.01f),
      Params(2.0f, 1000, 0.99f),
  };
  for (int trial = 0; trial < 12; ++trial) {
    int vocab = trial % 3 == 0 ? 7 : 500 + 300 * trial;
    std::vector<float> logits(vocab);
    for (float& v : logits) v = trial % 2 ? normal(rng) : 0.5f * coarse(rng);  // ties when coarse
    if (vocab > 10) logits[3] = -kInf, logits[4] = kNaN;
    for (SamplingParams params : configs) {
      params.seed = 100 + trial;
      ExpectMatchesReference(logits, params, 40);
      std::vector<float> probs = Distribution(logits, params);
      EXPECT_NEAR(std::accumulate(probs.begin(), probs.end(), 0.0), 1.0, 1e-5);
    }
  }
}

TEST(SamplingTest, LogSoftmax) {
  std::vector<float> logits = {1.0f, 2.0f, -kInf, 0.5f, kNaN};
  std::vector<float> out(5);
  LogSoftmax(logits.data(), 5, out.data());
  double log_sum = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(0.5));
  EXPECT_NEAR(out[0], 1.0 - log_sum, 1e-6);
  EXPECT_NEAR(out[1], 2.0 - log_sum, 1e-6);
  EXPECT_EQ(out[2], -kInf);
  EXPECT_NEAR(out[3], 0.5 - log_sum, 1e-6);
  EXPECT_EQ(out[4], -kInf);
  std::vector<float> dead = {-kInf, kNaN};
  LogSoftmax(dead.data(), 2, out.data());
  EXPECT_EQ(out[0], -kInf);
  EXPECT_EQ(out[1], -kInf);
}

// ---- distribution tests ---------------------------------------------------------------------

TEST(SamplingFitTest, SamplesFollowTheDistribution) {
  const SamplingParams configs[] = {
      Params(0.7f, 0, 1.0f, 0.0f, 1),  Params(1.0f, 0, 1.0f, 0.0f, 2),
      Params(1.5f, 0, 1.0f, 0.0f, 3),  Params(1.0f, 5, 1.0f, 0.0f, 4),  // splits the 0.9 tie
      Params(1.0f, 0, 0.8f, 0.0f, 5),  Params(1.0f, 0, 1.0f, 0.1f, 6),
      Params(0.8f, 8, 0.9f, 0.05f, 7),
  };
  for (const SamplingParams& params : configs) {
    SCOPED_TRACE(testing::Message() << "T=" << params.temperature << " k=" << params.top_k
                                    << " p=" << params.top_p << " min_p=" << params.min_p);
    std::vector<float> probs = Distribution(kFitLogits, params);
    EXPECT_GE(Support(probs).size(), 2u);
    EXPECT_EQ(probs[10], 0.0f);  // -inf
    EXPECT_EQ(probs[13], 0.0f);  // NaN
    std::vector<int64_t> counts = DrawCounts(kFitLogits, params, kNumFitSamples);
    FitResult fit = GoodnessOfFit(counts, probs, kNumFitSamples);
    EXPECT_EQ(fit.outside_support, 0);
    EXPECT_GT(fit.p_value, 1e-4);
  }
  // top_k = 5 cuts the tie at 0.9 (ids 5, 11) and keeps the lower id.
  std::vector<float> top5 = Distribution(kFitLogits, Params(1.0f, 5));
  EXPECT_EQ(Support(top5), (std::vector<int32_t>{0, 2, 5, 6, 9}));
}

TEST(SamplingFitTest, RejectsTheWrongDistribution) {
  std::vector<int64_t> counts =
      DrawCounts(kFitLogits, Params(0.7f, 0, 1.0f, 0.0f, 1), kNumFitSamples);
  FitResult right = GoodnessOfFit(counts, Distribution(kFitLogits, Params(0.7f)), kNumFitSamples);
  FitResult wrong = GoodnessOfFit(counts, Distribution(kFitLogits, Params(1.0f)), kNumFitSamples);
  EXPECT_GT(right.p_value, 1e-4);
  EXPECT_LT(wrong.p_value, 1e-6);
  // A small bias is caught too: T = 0.7 against T = 0.72.
  FitResult close = GoodnessOfFit(counts, Distribution(kFitLogits, Params(0.72f)), kNumFitSamples);
  EXPECT_LT(close.p_value, 1e-6);
}

// ---- large vocabulary -----------------------------------------------------------------------

TEST(SamplingTest, LargeVocabularyMatchesReference) {
  constexpr int64_t kVocab = 151936;
  std::mt19937 rng(77);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(kVocab);
  for (float& v : logits) v = normal(rng);
  logits[1234] = 25.0f;  // a confident head, as after a real lm_head
  logits[99] = 24.0f;
  const SamplingParams configs[] = {
      Params(1.0f, 0, 1.0f, 0.0f, 1),    Params(1.0f, 50, 1.0f, 0.0f, 2),
      Params(1.2f, 0, 0.9f, 0.0f, 3),    Params(1.0f, 0, 1.0f, 0.05f, 4),
      Params(0.9f, 40, 0.95f, 0.01f, 5), Params(3.0f, 0, 0.999f, 0.0f, 6),
      Params(2.0f, 5000, 1.0f, 0.0f, 7), Params(0.5f, 1, 1.0f, 0.0f, 8),
  };
  for (const SamplingParams& params : configs) ExpectMatchesReference(logits, params, 20);
  // A flat row: top-p has to order a large part of the vocabulary.
  std::vector<float> flat(kVocab, 0.5f);
  std::vector<float> probs = Distribution(flat, Params(1.0f, 0, 0.5f));
  EXPECT_EQ(static_cast<int64_t>(Support(probs).size()), kVocab / 2);
  EXPECT_EQ(Support(probs).back(), kVocab / 2 - 1);
  ExpectMatchesReference(flat, Params(1.0f, 0, 0.5f, 0.0f, 9), 20);
  // A flat row under top-k: the cut falls inside one bucket of equal weights; lowest ids stay.
  std::vector<int32_t> top_k_support = Support(Distribution(flat, Params(1.0f, 1000)));
  ASSERT_EQ(top_k_support.size(), 1000u);
  EXPECT_EQ(top_k_support.back(), 999);
}

}  // namespace
}  // namespace corolla::cpu
