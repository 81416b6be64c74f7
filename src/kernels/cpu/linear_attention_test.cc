// The CPU gated delta rule: the chunked (WY) form against the recurrent one over shapes, lengths
// (around and off the chunk size), fresh and continuing states, batches and extreme decays; the
// bf16 state as the f32 state rounded once per chunk in both forms; a perf mode (disabled) timing
// both forms. (The CUDA kernel is checked against this twin in kernels/cuda/cuda_kernels_test.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "base/numeric.h"
#include "kernels/cpu/linear_attention.h"
#include "kernels/cpu/ops.h"

namespace corolla {
namespace {

Tensor Random(Shape shape, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  Tensor t = Tensor::Empty(DType::kF32, shape);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.ptr<float>()[i] = ToFloat(ToBf16(u(rng)));  // bf16-exact
  return t;
}

Tensor I32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::Empty(DType::kI32, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.ptr<int32_t>());
  return t;
}

class GatedDeltaRuleBothForms : public ::testing::TestWithParam<int64_t> {};  // chunked_min_tokens

// A bf16 state must hold exactly what the f32 state computes from the same (bf16-representable)
// values, rounded to nearest even once per chunk; slots outside the batch stay untouched.
TEST_P(GatedDeltaRuleBothForms, Bf16StateIsTheF32StateRoundedOncePerChunk) {
  const int64_t chunked_min_tokens = GetParam();
  std::mt19937 rng(7);
  const int64_t hk = 2, hv = 4, dk = 32, dv = 16, slots = 4;
  // Three sequences: a chunk of 5 after 9 tokens (slot 2), one decode token after 40 (slot 0),
  // a fresh chunk of 3 (slot 3; its stale state must be ignored). Slot 1 is not in the batch.
  const std::vector<int32_t> query_start{0, 5, 6, 9}, seq_lens{14, 41, 3}, slot_ids{2, 0, 3};
  const int64_t tokens = query_start.back();
  Tensor q = Random({tokens, hk, dk}, 1.0f, rng), k = Random({tokens, hk, dk}, 1.0f, rng);
  Tensor v = Random({tokens, hv, dv}, 1.0f, rng);
  Tensor a = Random({tokens, hv}, 3.0f, rng), b = Random({tokens, hv}, 3.0f, rng);
  Tensor a_log = Random({hv}, 1.0f, rng), dt_bias = Random({hv}, 1.0f, rng);
  Tensor state32 = Random({slots, hv, dk, dv}, 0.2f, rng);
  Tensor state16 = Tensor::Empty(DType::kBF16, {slots, hv, dk, dv});
  for (int64_t i = 0; i < state32.numel(); ++i)
    state16.ptr<bf16>()[i] = ToBf16(state32.ptr<float>()[i]);
  const std::vector<bf16> before(state16.ptr<bf16>(), state16.ptr<bf16>() + state16.numel());
  Tensor qs = I32(query_start), lens = I32(seq_lens), sl = I32(slot_ids);
  AttentionBatch batch{qs, lens, TensorView(), TensorView(), 5, 41};
  Tensor out32 = Tensor::Empty(DType::kF32, {tokens, hv, dv}),
         out16 = Tensor::Empty(DType::kF32, {tokens, hv, dv});
  cpu::GatedDeltaRule(q, k, v, a, b, a_log, dt_bias, state32, sl, batch, out32, chunked_min_tokens);
  cpu::GatedDeltaRule(q, k, v, a, b, a_log, dt_bias, state16, sl, batch, out16, chunked_min_tokens);
  for (int64_t i = 0; i < out32.numel(); ++i)
    ASSERT_EQ(out32.ptr<float>()[i], out16.ptr<float>()[i]) << i;
  const int64_t per_slot = hv * dk * dv;
  for (int64_t i = 0; i < state32.numel(); ++i) {
    const bf16 got = state16.ptr<bf16>()[i];
    const bf16 want =
        i / per_slot == 1 ? before[i] : ToBf16(state32.ptr<float>()[i]);  // slot 1 untouched
    ASSERT_EQ(got.bits, want.bits) << "element " << i << " of slot " << i / per_slot;
  }
}

INSTANTIATE_TEST_SUITE_P(Forms, GatedDeltaRuleBothForms,
                         ::testing::Values(cpu::kGatedDeltaAlwaysRecurrent, cpu::kGatedDeltaAlwaysChunked));

// Inputs of one GatedDeltaRule call: a batch of sequences, each `lengths[i]` new tokens after
// `prefix` earlier ones (0: fresh state), sequence i in slot num_seqs - 1 - i.
struct DeltaRuleCase {
  int64_t hk, hv, dk, dv;
  std::vector<int32_t> lengths;
  int32_t prefix = 0;
  float a_log_lo = -1.0f, a_log_hi = 1.0f, a_scale = 3.0f;
};

struct DeltaRuleInputs {
  Tensor q, k, v, a, b, a_log, dt_bias, state, qs, lens, slots;
  int64_t tokens = 0;
  int max_len = 0;
  AttentionBatch batch() const { return {qs, lens, TensorView(), TensorView(), max_len, max_len}; }
};

DeltaRuleInputs MakeInputs(const DeltaRuleCase& c, std::mt19937& rng) {
  DeltaRuleInputs in;
  const int64_t num_seqs = c.lengths.size();
  std::vector<int32_t> query_start{0}, seq_lens, slot_ids;
  for (int64_t i = 0; i < num_seqs; ++i) {
    query_start.push_back(query_start.back() + c.lengths[i]);
    seq_lens.push_back(c.prefix + c.lengths[i]);
    slot_ids.push_back(static_cast<int32_t>(num_seqs - 1 - i));
    in.max_len = std::max(in.max_len, c.prefix + c.lengths[i]);
  }
  in.tokens = query_start.back();
  in.q = Random({in.tokens, c.hk, c.dk}, 1.0f, rng);
  in.k = Random({in.tokens, c.hk, c.dk}, 1.0f, rng);
  in.v = Random({in.tokens, c.hv, c.dv}, 1.0f, rng);
  in.a = Random({in.tokens, c.hv}, c.a_scale, rng);
  in.b = Random({in.tokens, c.hv}, 3.0f, rng);
  in.a_log = Random({c.hv}, 1.0f, rng);
  std::uniform_real_distribution<float> a_log(c.a_log_lo, c.a_log_hi);
  for (int64_t h = 0; h < c.hv; ++h) in.a_log.ptr<float>()[h] = a_log(rng);
  in.dt_bias = Random({c.hv}, 1.0f, rng);
  in.state = Random({num_seqs, c.hv, c.dk, c.dv}, 1.0f, rng);
  in.qs = I32(query_start);
  in.lens = I32(seq_lens);
  in.slots = I32(slot_ids);
  return in;
}

struct DeltaRuleResult {
  Tensor out, state;
};

DeltaRuleResult RunDeltaRule(const DeltaRuleInputs& in, int64_t chunked_min_tokens) {
  DeltaRuleResult r{Tensor::Empty(DType::kF32, {in.tokens, in.v.dim(1), in.v.dim(2)}),
                    Tensor::Empty(DType::kF32, in.state.shape())};
  std::fill_n(r.out.ptr<float>(), r.out.numel(), std::numeric_limits<float>::quiet_NaN());  // poison
  std::copy_n(in.state.ptr<float>(), in.state.numel(), r.state.ptr<float>());
  cpu::GatedDeltaRule(in.q, in.k, in.v, in.a, in.b, in.a_log, in.dt_bias, r.state, in.slots, in.batch(), r.out,
                      chunked_min_tokens);
  return r;
}

// max |got - want| / max |want| (NaN anywhere counts as infinite error).
double MaxRelativeError(const Tensor& got, const Tensor& want) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.ptr<float>()[i], w = want.ptr<float>()[i];
    if (!std::isfinite(g) || !std::isfinite(w)) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, std::abs(g - w));
    scale = std::max(scale, std::abs(w));
  }
  return scale == 0 ? diff : diff / scale;
}

void ExpectChunkedMatchesRecurrent(const DeltaRuleCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const DeltaRuleInputs in = MakeInputs(c, rng);
  const DeltaRuleResult want = RunDeltaRule(in, cpu::kGatedDeltaAlwaysRecurrent);
  const DeltaRuleResult got = RunDeltaRule(in, cpu::kGatedDeltaAlwaysChunked);
  const double out_err = MaxRelativeError(got.out, want.out), state_err = MaxRelativeError(got.state, want.state);
  SCOPED_TRACE(::testing::Message() << "Hk " << c.hk << " Hv " << c.hv << " Dk " << c.dk << " Dv " << c.dv
                                    << " prefix " << c.prefix << " A_log [" << c.a_log_lo << ", " << c.a_log_hi
                                    << "] a scale " << c.a_scale);
  EXPECT_LT(out_err, 1e-5);
  EXPECT_LT(state_err, 1e-5);
  std::printf("Hk %ld Hv %ld Dk %ld Dv %ld prefix %d: max relative error out %.2e state %.2e\n", c.hk, c.hv, c.dk,
              c.dv, c.prefix, out_err, state_err);
}

// Every length 1..300 (one sequence each, in one batch), fresh and continuing, on a small head.
TEST(GatedDeltaRuleCpu, ChunkedMatchesRecurrentAtEveryLength) {
  DeltaRuleCase c{2, 4, 32, 32, {}};
  for (int32_t len = 1; len <= 300; ++len) c.lengths.push_back(len);
  for (int32_t prefix : {0, 17}) {
    c.prefix = prefix;
    ExpectChunkedMatchesRecurrent(c, 11 + prefix);
  }
}

// Head shapes (GQA 2/4, 1/1, 4/8; Dk, Dv 32..128), lengths around the chunk size, batched.
TEST(GatedDeltaRuleCpu, ChunkedMatchesRecurrentOverShapes) {
  const std::vector<int32_t> lengths{1, 63, 64, 65, 130, 300, 7};
  for (auto [hk, hv, dk, dv] : std::vector<std::array<int64_t, 4>>{
           {2, 4, 128, 128}, {1, 1, 64, 128}, {4, 8, 128, 64}, {2, 4, 32, 96}, {1, 1, 96, 32}}) {
    for (int32_t prefix : {0, 200}) ExpectChunkedMatchesRecurrent({hk, hv, dk, dv, lengths, prefix}, 23 + prefix);
  }
}

// Decays from none (A_log -20: g ~ -1e-9) through total (A_log 8, |a| up to 30: g ~ -9e4, exp(g) = 0)
// to g = -inf (A_log 100: exp(A_log) overflows): no overflow, no NaN, the same zeros.
TEST(GatedDeltaRuleCpu, ChunkedMatchesRecurrentAtExtremeDecays) {
  const std::vector<int32_t> lengths{64, 150, 300};
  for (auto [lo, hi] : std::vector<std::array<float, 2>>{{-20, -15}, {3, 8}, {100, 100}, {-20, 8}}) {
    for (int32_t prefix : {0, 5}) {
      DeltaRuleCase c{2, 4, 64, 64, lengths, prefix, lo, hi, 30.0f};
      ExpectChunkedMatchesRecurrent(c, 31 + prefix);
    }
  }
}

// The plain entry point takes the chunked form from kGatedDeltaChunkedMinTokens tokens on and
// the recurrent one below: each sequence matches its forced form bit for bit.
TEST(GatedDeltaRuleCpu, ThresholdPicksTheForm) {
  std::mt19937 rng(41);
  const int32_t at = static_cast<int32_t>(cpu::kGatedDeltaChunkedMinTokens);
  const DeltaRuleInputs long_seq = MakeInputs({2, 4, 32, 32, {at}, 3}, rng);
  const DeltaRuleInputs short_seq = MakeInputs({2, 4, 32, 32, {at - 1}, 3}, rng);
  for (const auto& [in, forced] : {std::pair{&long_seq, cpu::kGatedDeltaAlwaysChunked},
                                   std::pair{&short_seq, cpu::kGatedDeltaAlwaysRecurrent}}) {
    const DeltaRuleResult got = RunDeltaRule(*in, cpu::kGatedDeltaChunkedMinTokens), want = RunDeltaRule(*in, forced);
    EXPECT_EQ(MaxRelativeError(got.out, want.out), 0.0);
    EXPECT_EQ(MaxRelativeError(got.state, want.state), 0.0);
  }
}

// Perf mode: one Qwen3.5-397B-shaped layer slice (Hk 2, Hv 8, Dk = Dv = 128), one fresh
// 2048-token prefill, each form. Run with --gtest_also_run_disabled_tests.
TEST(GatedDeltaRuleCpu, DISABLED_Speed) {
  std::mt19937 rng(5);
  const DeltaRuleInputs in = MakeInputs({2, 8, 128, 128, {2048}, 0}, rng);
  double seconds[2];
  for (int form = 0; form < 2; ++form) {
    const int64_t threshold = form == 0 ? cpu::kGatedDeltaAlwaysRecurrent : cpu::kGatedDeltaAlwaysChunked;
    RunDeltaRule(in, threshold);  // warm
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      RunDeltaRule(in, threshold);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    seconds[form] = best;
    std::printf("%-9s Hk 2 Hv 8 Dk 128 Dv 128, 2048 tokens: %8.2f ms, %9.0f tokens/s\n",
                form == 0 ? "recurrent" : "chunked", best * 1e3, 2048 / best);
  }
  std::printf("chunked / recurrent speed: %.2fx\n", seconds[0] / seconds[1]);
}

}  // namespace
}  // namespace corolla
