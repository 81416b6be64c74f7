// Philox4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3", SC11) and the
// one uniform a sampler step draws. Pure functions; thread-safe. The CUDA sampler implements the
// same arithmetic so that both backends draw the same u for the same (seed, step).
#include "kernels/sampling.h"

namespace corolla {
namespace {

// Round multipliers and Weyl key increments of Philox4x32 (the paper's table 2 / Random123).
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // sqrt(3) - 1
constexpr int kPhiloxRounds = 10;

inline void MulHiLo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

}  // namespace

// Counter words: c0, c1 = counter_lo (low, high half), c2, c3 = counter_hi; key words k0, k1 =
// key (low, high half). This is Random123's word order, so its known-answer vectors apply.
void Philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo, uint32_t out[4]) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {  // the key schedule advances between rounds
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    MulHiLo(kPhiloxM0, c0, &hi0, &lo0);
    MulHiLo(kPhiloxM1, c2, &hi1, &lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// Key = seed, counter = (step, 0); the top 24 bits of the first word scaled by 2^-24 give a
// float in [0, 1) that is exact (24 bits fit the mantissa), so u < 1 always holds.
float UniformFromSeed(uint64_t seed, uint64_t step) {
  uint32_t words[4];
  Philox4x32(seed, /*counter_hi=*/0, /*counter_lo=*/step, words);
  return static_cast<float>(words[0] >> 8) * 0x1p-24f;
}

}  // namespace corolla
