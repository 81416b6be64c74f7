// Host-side RoPE frequency tables, shared by every backend.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/backend.h"

namespace corolla {

std::vector<float> RopeInvFreq(const RopeParams& p) {
  const int dim = p.rotary_dim, half = dim / 2;
  std::vector<float> inv_freq(half);
  // base^(2i/dim) in float32, as transformers computes it.
  std::vector<float> pos_freq(half);
  for (int i = 0; i < half; ++i)
    pos_freq[i] = static_cast<float>(std::pow(static_cast<double>(p.theta), static_cast<double>(2 * i) / dim));
  if (p.yarn_factor <= 1.0f) {
    for (int i = 0; i < half; ++i) inv_freq[i] = 1.0f / pos_freq[i];
    return inv_freq;
  }
  // YaRN: dimensions that rotate more than beta_fast times over the original context keep their
  // frequency (extrapolation), those under beta_slow are divided by the factor (interpolation),
  // with a linear ramp between.
  auto correction_dim = [&](double rotations) {
    return dim * std::log(p.yarn_original_max_positions / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(static_cast<double>(p.theta)));
  };
  double low = std::max(std::floor(correction_dim(p.yarn_beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(p.yarn_beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < half; ++i) {
    float ramp = std::clamp(static_cast<float>((i - low) / (high - low)), 0.0f, 1.0f);
    float extrapolation = 1.0f - ramp;
    float interpolated = 1.0f / (p.yarn_factor * pos_freq[i]);
    float extrapolated = 1.0f / pos_freq[i];
    inv_freq[i] = interpolated * (1.0f - extrapolation) + extrapolated * extrapolation;
  }
  return inv_freq;
}

}  // namespace corolla
