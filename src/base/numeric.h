// Scalar storage types of checkpoints and activations: bfloat16, float16 and float8 e4m3 (fn:
// no infinities, one NaN pattern, max 448), with exact conversions to float and
// round-to-nearest-even conversions from float. Plain values; thread-safe.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace corolla {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct bf16 {
  uint16_t bits = 0;
  static bf16 FromBits(uint16_t b) { bf16 v; v.bits = b; return v; }
};

inline float ToFloat(bf16 v) { return BitsFloat(static_cast<uint32_t>(v.bits) << 16); }
inline bf16 ToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffff) > 0x7f800000) return bf16::FromBits(0x7fc0);  // NaN stays NaN
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return bf16::FromBits(static_cast<uint16_t>(u >> 16));
}

struct fp16 {
  uint16_t bits = 0;
  static fp16 FromBits(uint16_t b) { fp16 v; v.bits = b; return v; }
};

inline float ToFloat(fp16 v) {
  uint32_t sign = (v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1f;
  uint32_t mant = v.bits & 0x3ff;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}
fp16 ToFp16(float f);

// float8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; 0x7f/0xff are NaN.
struct fp8e4m3 {
  uint8_t bits = 0;
  static fp8e4m3 FromBits(uint8_t b) { fp8e4m3 v; v.bits = b; return v; }
};

inline float ToFloat(fp8e4m3 v) {
  uint32_t sign = v.bits & 0x80;
  uint32_t exp = (v.bits >> 3) & 0xf;
  uint32_t mant = v.bits & 0x7;
  float f;
  if (exp == 0xf && mant == 0x7) {
    f = NAN;
  } else if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 * 2^-6
  } else {
    f = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, static_cast<int>(exp) - 7);
  }
  return sign ? -f : f;
}
// Saturates to +-448 (as the reference quantisers clamp before casting).
fp8e4m3 ToFp8e4m3(float f);

}  // namespace corolla
