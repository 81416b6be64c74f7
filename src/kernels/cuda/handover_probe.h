// What a handover between two dependent steps costs on the batch-1 decode step's critical path,
// alone and with bulk copies in flight on other SMs (CudaPerf.HandoverUnderCopies; the question
// of notes/decode_sessions.md, Session 13: do in-flight weight copies delay a programmatic
// dependent launch's release, a flag between CTAs, or every L2 round trip alike?).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace corolla::cuda {

struct HandoverProbe {
  double pdl_release_us = 0;  // a 1-CTA kernel's last timestamp to its PDL dependent's wait return
  double flag_us = 0;         // a release store in one CTA to another CTA's acquire load seeing it
  double flag_clean_us = 0;   // the same with no global store of the producer's before the release
  double flag_relaxed_us = 0;  // a relaxed store to another CTA's relaxed load seeing it (no fence)
  double l2_trip_us = 0;      // one dependent ld.global.cg of a line in L2
  double copy_gbs = 0;        // what the copier pulled from HBM meanwhile (0 without one)
  bool timed_out = false;     // a probe gave up waiting (a CTA never became resident): no figures
};

// Medians over `rounds` rounds of each probe. copier_ctas > 0: as many CTAs (one an SM, at most
// the SM count less 4) bulk-copy `chunk_bytes` pieces of `src` (`src_bytes` of device memory,
// far past L2) into shared memory, 4 in flight a CTA, on stream `side` until the probes on `s`
// end; the probes start once every copier CTA runs.
HandoverProbe RunHandoverProbe(const void* src, int64_t src_bytes, int copier_ctas, int chunk_bytes, int rounds,
                               cudaStream_t s, cudaStream_t side);

}  // namespace corolla::cuda
