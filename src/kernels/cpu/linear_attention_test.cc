// The CPU gated delta rule with a bf16 recurrent state: it must compute exactly what the f32
// state computes from the same (bf16-representable) values and store that result rounded to
// nearest even, once per chunk; slots outside the batch stay untouched. (The CUDA kernel is
// checked against this twin in kernels/cuda/cuda_kernels_test.cc.)
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "base/numeric.h"
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

TEST(GatedDeltaRuleCpu, Bf16StateIsTheF32StateRoundedOncePerChunk) {
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
  cpu::GatedDeltaRule(q, k, v, a, b, a_log, dt_bias, state32, sl, batch, out32);
  cpu::GatedDeltaRule(q, k, v, a, b, a_log, dt_bias, state16, sl, batch, out16);
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

}  // namespace
}  // namespace corolla
