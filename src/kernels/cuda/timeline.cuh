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
// kLocal: thread 0 keeps its stamps in shared memory (kTimelineFields u64) until it leaves. A
// stamp stored to global memory where it is taken sits in the phase it times wherever a release
// at cluster or GPU scope follows (a cluster barrier after a mark waits for the store to be
// performed: ~0.5-1 us while copies stream); the kernels that mark phases before such barriers
// (the decode attention, the cluster norm-router) take TimelineScopeLocal.
template <bool kLocal>
class TimelineScopeT {
 public:
  __device__ explicit TimelineScopeT(uint64_t* const& record) : rec_(record) {
    if (kLocal && rec_ != nullptr && threadIdx.x == 0)
      for (int i = 0; i < kTimelineFields; ++i) Local()[i] = 0;
    Stamp(0);
  }
  __device__ void Waited() const { Stamp(1); }
  __device__ void Mark(int i) const { Stamp(3 + i); }
  __device__ ~TimelineScopeT() {
    if (rec_ == nullptr) return;
    if (threadIdx.x % 32 == 0)
      atomicMax(reinterpret_cast<unsigned long long*>(Cta() + 2), static_cast<unsigned long long>(TimelineNowNs()));
    if (kLocal && threadIdx.x == 0)  // (after the exit's stamp, which it would otherwise delay)
      for (int i = 0; i < kTimelineFields; ++i)
        if (i != 2) Cta()[i] = Local()[i];
  }
  TimelineScopeT(const TimelineScopeT&) = delete;
  TimelineScopeT& operator=(const TimelineScopeT&) = delete;

 private:
  __device__ static uint64_t* Local() {
    __shared__ uint64_t stamps[kLocal ? kTimelineFields : 1];
    return stamps;
  }
  __device__ uint64_t* Cta() const {
    return rec_ + kTimelineFields * (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  }
  __device__ void Stamp(int i) const {
    if (rec_ != nullptr && threadIdx.x == 0) (kLocal ? Local() : Cta())[i] = TimelineNowNs();
  }
  uint64_t* const& rec_;
};
using TimelineScope = TimelineScopeT<false>;
using TimelineScopeLocal = TimelineScopeT<true>;

}  // namespace corolla::cuda
