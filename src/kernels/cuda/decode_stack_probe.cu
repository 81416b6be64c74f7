// DecodeStackStreamProbe (decode_stack.h): what a ring of bulk-copy stages, as decode_stack.cu's
// producers fill them, pulls from HBM when nothing else runs.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decode_stack.h"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

using wgmma::BulkCopy;
using wgmma::MbarArrive;
using wgmma::MbarArriveExpectTx;
using wgmma::MbarInit;
using wgmma::MbarInitFence;
using wgmma::MbarWait;
using wgmma::SmemAddr;

// A streaming probe for the weight rings (CudaPerf.DecodeStackStream): each CTA streams its
// share of `src` through `stages` shared-memory stages of `stage_bytes`, each filled by
// `copies` bulk copies issued by as many producer lanes; one consumer warp only waits and
// frees the stages. Measures what the ring can pull from HBM on its own.
__global__ void __launch_bounds__(64, 1)
    StreamProbeKernel(const uint8_t* src, int64_t bytes_per_cta, int stage_bytes, int stages,
                      int copies, unsigned* sink) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid % 32;
  const uint32_t base = SmemAddr(smem), full = base + stages * stage_bytes,
                 empty = full + stages * 8;
  if (tid == 0) {
    for (int i = 0; i < stages; ++i) {
      MbarInit(full + i * 8, 1);
      MbarInit(empty + i * 8, 1);
    }
    MbarInitFence();
  }
  __syncthreads();
  const uint8_t* p = src + bytes_per_cta * blockIdx.x;
  const int64_t n = bytes_per_cta / stage_bytes;
  const int piece = stage_bytes / copies;
  unsigned acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t slot = static_cast<uint32_t>(i % stages),
                   phase = static_cast<uint32_t>(i / stages);
    if (tid < 32) {  // producer
      if (lane == 0) {
        if (phase > 0) MbarWait(empty + slot * 8, (phase - 1) & 1);
        MbarArriveExpectTx(full + slot * 8, stage_bytes);
      }
      __syncwarp();
      if (lane < copies)
        BulkCopy(base + slot * stage_bytes + lane * piece, p + i * stage_bytes + lane * piece,
                 piece, full + slot * 8);
    } else {  // consumer
      MbarWait(full + slot * 8, phase & 1);
      acc += smem[slot * stage_bytes + lane * 4];
      __syncwarp();
      if (lane == 0) MbarArrive(empty + slot * 8);
    }
  }
  if (acc == 0xffffffffu) *sink = acc;
}

}  // namespace

double DecodeStackStreamProbe(const void* src, int64_t bytes, int stage_bytes, int stages,
                              int copies, cudaStream_t s) {
  int dev = 0, sms = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&dev));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const size_t smem = static_cast<size_t>(stages) * stage_bytes + stages * 16;
  COROLLA_CUDA_CHECK(
      cudaFuncSetAttribute(StreamProbeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int64_t per_cta = bytes / sms / stage_bytes * stage_bytes;
  unsigned* sink = nullptr;
  COROLLA_CUDA_CHECK(cudaMallocAsync(&sink, 4, s));
  cudaEvent_t a, b;
  COROLLA_CUDA_CHECK(cudaEventCreate(&a));
  COROLLA_CUDA_CHECK(cudaEventCreate(&b));
  auto launch = [&] {
    StreamProbeKernel<<<sms, 64, smem, s>>>(static_cast<const uint8_t*>(src), per_cta, stage_bytes,
                                            stages, copies, sink);
  };
  launch();
  COROLLA_CUDA_CHECK(cudaEventRecord(a, s));
  for (int r = 0; r < 5; ++r) launch();
  COROLLA_CUDA_CHECK(cudaEventRecord(b, s));
  COROLLA_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  COROLLA_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  COROLLA_CUDA_CHECK(cudaEventDestroy(a));
  COROLLA_CUDA_CHECK(cudaEventDestroy(b));
  COROLLA_CUDA_CHECK(cudaFreeAsync(sink, s));
  return 5.0 * per_cta * sms / (ms * 1e-3) / 1e9;
}

}  // namespace corolla::cuda
