#include "base/numeric.h"

#include <algorithm>

namespace corolla {

fp16 ToFp16(float f) {
  uint32_t u = FloatBits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  uint32_t abs = u & 0x7fffffff;
  if (abs > 0x7f800000) return fp16::FromBits(sign | 0x7e00);
  if (abs >= 0x477ff000) return fp16::FromBits(sign | 0x7c00);  // rounds to inf
  if (abs < 0x38800000) {  // subnormal or zero in fp16: round(|f| * 2^24)
    float a = BitsFloat(abs);
    float scaled = std::nearbyint(std::ldexp(a, 24));  // default rounding mode: nearest even
    return fp16::FromBits(sign | static_cast<uint16_t>(scaled));
  }
  uint32_t rounded = abs + 0xfff + ((abs >> 13) & 1);
  return fp16::FromBits(sign | static_cast<uint16_t>((rounded - 0x38000000) >> 13));
}

fp8e4m3 ToFp8e4m3(float f) {
  if (std::isnan(f)) return fp8e4m3::FromBits(0x7f);
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::min(std::fabs(f), 448.0f);
  // Smallest normal is 2^-6; below it the grid is uniform with step 2^-9.
  if (a < std::ldexp(1.0f, -6)) {
    float q = std::nearbyint(std::ldexp(a, 9));  // 0..8; 8 is the smallest normal
    return fp8e4m3::FromBits(sign | static_cast<uint8_t>(q));
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  // Normal: a = (1 + k/8) * 2^(e-1); quantise k with nearest even.
  float k = std::nearbyint((m * 2.0f - 1.0f) * 8.0f);
  int exp = e - 1;
  if (k >= 8.0f) {
    k = 0.0f;
    exp += 1;
  }
  uint8_t bits = static_cast<uint8_t>(((exp + 7) << 3) | static_cast<int>(k));
  if (bits > 0x7e) bits = 0x7e;  // 448
  return fp8e4m3::FromBits(sign | bits);
}

}  // namespace corolla
