// What a kernel's code costs when it runs cold (CudaPerf.ColdCode; the question of session 37:
// the nucleus sampler's fused kernel, 290 KB of code, ran ~12 us slower right after the decode
// graph than launched again at once, even with the L2 emptied in between). One CTA an SM runs
// `kb` KB of straight-line instructions (independent FMAs: about one an issue cycle when warm),
// timed from its first instruction to its last.
#pragma once

#include <cuda_runtime.h>

namespace corolla::cuda {

struct ColdCodeProbe {
  double warm_us = 0;         // run again at once: the code in the SMs' instruction caches
  double icache_cold_us = 0;  // after 256 KB of other code ran on every SM: the code from L2
  double l2_cold_us = 0;      // that, then the L2 emptied (a 256 MB memset): the code from HBM
  double warm_cycles = 0;     // the same three in SM cycles (clock64), against clock changes
  double icache_cold_cycles = 0;
  double l2_cold_cycles = 0;
};

// Medians over `rounds` rounds (and over the CTAs) for a probe of `kb` KB of code: 4, 16 or 64.
ColdCodeProbe RunColdCodeProbe(int kb, int rounds, cudaStream_t s);

// Runs 256 KB of straight-line code on every SM (several CTAs an SM) on stream s: what the SMs'
// instruction caches held is gone, the L2's data stays (it reads 36 bytes). A probe's helper: its
// buffer is made once, on the device current at the first call.
void ThrashInstructionCaches(cudaStream_t s);

}  // namespace corolla::cuda
