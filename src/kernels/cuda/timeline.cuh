// Device side of the decode-step timeline (timeline.h): a kernel holds a TimelineScope from its
// first statement, calls Waited() right after its GridDependencyWait, and every warp's leaving
// marks the CTA's exit (the scope's destructor runs on every return path). Mark(i), i <
// kTimelineMarks, stamps a phase of the kernel where thread 0 passes it.
#pragma once

#include <cstdint>

#include "kernels/cuda/timeline.h"

namespace corolla::cuda {

__device__ __forceinline__ uint64_t TimelineNowNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Holds a reference to the kernel's (__grid_constant__) parameter rather than a copy, so the
// record's address is re-read from the parameter bank where it is used instead of taking a
// register through the whole kernel (a register more made PairDownSlots spill).
class TimelineScope {
 public:
  __device__ explicit TimelineScope(uint64_t* const& record) : rec_(record) { Stamp(0); }
  __device__ void Waited() const { Stamp(1); }
  __device__ void Mark(int i) const { Stamp(3 + i); }
  __device__ ~TimelineScope() {
    if (rec_ != nullptr && threadIdx.x % 32 == 0)
      atomicMax(reinterpret_cast<unsigned long long*>(Cta() + 2), static_cast<unsigned long long>(TimelineNowNs()));
  }
  TimelineScope(const TimelineScope&) = delete;
  TimelineScope& operator=(const TimelineScope&) = delete;

 private:
  __device__ uint64_t* Cta() const {
    return rec_ + kTimelineFields * (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  }
  __device__ void Stamp(int i) const {
    if (rec_ != nullptr && threadIdx.x == 0) Cta()[i] = TimelineNowNs();
  }
  uint64_t* const& rec_;
};

}  // namespace corolla::cuda
