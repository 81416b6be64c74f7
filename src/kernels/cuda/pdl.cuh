// Programmatic dependent launch (sm_90): a kernel launched through LaunchPdl may start while the
// kernel before it in the stream is still finishing, so its launch latency and its prologue
// (block scheduling, index math, loads of weights) overlap the previous kernel's tail; inside a
// CUDA graph the capture keeps this as a programmatic edge. The contract of a kernel launched
// so: it calls GridDependencyWait() before it reads anything an earlier kernel of the stream
// writes and before it writes anything at all; before the wait it may only read memory no
// kernel writes during a forward (weights). GridDependencyWait() returns once every earlier
// kernel has completed and its writes are visible (a no-op when launched without the
// attribute), so the ordering stays transitive along the stream. TriggerDependents(), right
// after the wait, lets the next such kernel be scheduled (it only takes resources this grid
// leaves free: it fires once every CTA of this grid has reached it). A kernel may trigger before
// its wait instead (RmsNorm with Tuning().pdl_early_trigger, the attention prologue with
// Tuning().prologue_early_trigger): the next kernel's own wait still covers this grid, which
// cannot end before this grid's wait returns; that kernel then starts its weight-only prologue
// (a staged GEMV's copies) one kernel earlier. Or later than its wait (the decode attention after
// its passes, Tuning().attention_decode_trigger), so that those copies do not land while this
// grid waits and loads: bytes in flight hold back a wait's return and a handover.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace corolla::cuda {

__device__ __forceinline__ void GridDependencyWait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void TriggerDependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// Sets `carveout` (percent; < 0: leave the driver's choice) as the kernel's preferred
// shared-memory carveout, once per (device, kernel): function attributes are per device.
inline void SetCarveoutOnce(const void* kernel, int carveout) {
  if (carveout < 0) return;
  int device = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::set<std::tuple<int, const void*, int>> done;
  std::lock_guard<std::mutex> lock(mu);
  if (!done.emplace(device, kernel, carveout).second) return;
  COROLLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, carveout));
}

// Opts `kernel` in to the device's largest dynamic shared memory (the opt-in maximum less the
// kernel's static shared memory), once per (device, kernel): function attributes are per device.
inline void OptInSharedMemoryOnce(const void* kernel) {
  int device = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::set<std::pair<int, const void*>> done;
  std::lock_guard<std::mutex> lock(mu);
  if (!done.emplace(device, kernel).second) return;
  int max_smem = 0;
  cudaFuncAttributes attrs{};
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  COROLLA_CUDA_CHECK(cudaFuncGetAttributes(&attrs, kernel));
  COROLLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          max_smem - static_cast<int>(attrs.sharedSizeBytes)));
}

// How many CTAs of `kernel` (`threads` each, `smem` bytes of dynamic shared memory) this device
// holds at once: its occupancy per SM times the SMs, kept per (device, kernel, threads, smem).
inline int64_t ResidentCtas(const void* kernel, int threads, size_t smem) {
  int device = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, size_t>, int64_t> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(device, kernel, threads, smem);
  if (auto it = known.find(key); it != known.end()) return it->second;
  int sms = 0, per_sm = 0;
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  COROLLA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  const int64_t ctas = int64_t{per_sm} * sms;
  known.emplace(key, ctas);
  return ctas;
}

// How many clusters of `ctas` CTAs of `kernel` (`threads` each, `smem` bytes of dynamic shared
// memory) this device can hold at once (cudaOccupancyMaxActiveClusters; 0 where it refuses), and
// whether it can place one at all (ClusterFits); sizes past the portable 8 are allowed first. The
// answer is kept per (device, kernel, ctas, threads, smem).
inline int ClusterCapacity(const void* kernel, int ctas, int threads, size_t smem) {
  int device = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, int, size_t>, int> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(device, kernel, ctas, threads, smem);
  if (auto it = known.find(key); it != known.end()) return it->second;
  if (ctas > 8) COROLLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(ctas);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(ctas);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) clusters = 0;
  (void)cudaGetLastError();  // a refused query leaves no sticky error
  known.emplace(key, clusters);
  return clusters;
}
inline bool ClusterFits(const void* kernel, int ctas, int threads, size_t smem) {
  return ClusterCapacity(kernel, ctas, threads, smem) > 0;
}

// kernel<<<grid, block, smem, s>>>(args...), with programmatic stream serialisation allowed
// when Tuning().pdl is on (COROLLA_PDL=0 turns it off), and optionally a thread block cluster
// of cluster_x CTAs along x. Checks the launch.
template <typename... Params, typename... Args>
void LaunchPdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, int cluster_x,
               Args&&... args) {
  SetCarveoutOnce(reinterpret_cast<const void*>(kernel), Tuning().pdl_carveout);
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = s;
  cudaLaunchAttribute attrs[2];
  int n = 0;
  attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[n].val.programmaticStreamSerializationAllowed = Tuning().pdl ? 1 : 0;
  ++n;
  if (cluster_x > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = static_cast<unsigned>(cluster_x);
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  config.attrs = attrs;
  config.numAttrs = n;
  COROLLA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace corolla::cuda
