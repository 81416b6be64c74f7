// Tuning().moe_prefetch_qkv's dealing of expert rows to the qkv projection's CTAs (gemv_staged.cuh's
// PrefetchPickedExperts), shared with host tests: plain C++ where nvcc does not compile it.
#pragma once

#include <cstdint>

#ifndef COROLLA_HOST_DEVICE
#ifdef __CUDACC__
#define COROLLA_HOST_DEVICE __host__ __device__
#else
#define COROLLA_HOST_DEVICE
#endif
#endif

namespace corolla::cuda {

// A pick's rows to prefetch lie in three regions: its gate rows and its up rows (`gate_bytes`
// each) and its W_down rows (`down_bytes`), all multiples of 16 bytes. Laid end to end over the
// top_k picks, they are dealt to `ctas` CTAs in equal shares of whole 16-byte units, and CTA
// `cta`'s share is visited in pieces that each lie in one region:
// visit(slot, region (0 gate, 1 up, 2 down), offset in the region, bytes).
template <typename Visit>
COROLLA_HOST_DEVICE inline void ForEachExpertPrefetch(int64_t gate_bytes, int64_t down_bytes, int top_k, int cta,
                                                      int ctas, Visit&& visit) {
  const int64_t per_pick = 2 * gate_bytes + down_bytes, units = per_pick * top_k / 16;
  int64_t at = units * cta / ctas * 16;
  const int64_t end = units * (cta + 1) / ctas * 16;
  while (at < end) {
    const int slot = static_cast<int>(at / per_pick);
    const int64_t off = at % per_pick;
    const int region = off < gate_bytes ? 0 : off < 2 * gate_bytes ? 1 : 2;
    const int64_t region_begin = region * gate_bytes, region_end = region < 2 ? region_begin + gate_bytes : per_pick;
    const int64_t bytes = end - at < region_end - off ? end - at : region_end - off;
    visit(slot, region, off - region_begin, bytes);
    at += bytes;
  }
}

}  // namespace corolla::cuda
