// RunL2RetentionProbe (l2_probe.h): a slice of weights read as the staged GEMV reads it (one CTA
// an SM, bulk copies into shared memory), cold, hot, and after an L2 prefetch with and without a
// weight stream in between (the MoE's: 16-byte loads, evict-first, every SM). LaunchL2Gap: a
// timed pause that bulk-prefetches ranges into L2.
#include "kernels/cuda/l2_probe.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

using wgmma::GlobalTimerNs;

constexpr int kPieces = 4;                          // bulk copies a CTA (the staged GEMV's warps)
constexpr int64_t kMaxSlice = 200 * 1024;           // bytes a CTA
constexpr int64_t kFlushBytes = int64_t{256} << 20;  // read normally: evicts what is not evict-last
constexpr int64_t kMaxStream = int64_t{512} << 20;
constexpr int64_t kSliceStride = int64_t{24} << 20;  // distinct slices, 24 MB apart
constexpr int kCases = 5;                            // slices a round: cold/hot share one

// One thread a CTA: its `slice` bytes at src + blockIdx.x * slice in kPieces bulk copies on one
// mbarrier; t[0] the earliest start, t[1] the latest landing (ns).
__global__ void __launch_bounds__(32, 1) StagedReadKernel(const uint8_t* src, int slice, unsigned long long* t) {
  extern __shared__ __align__(128) uint8_t smem[];
  if (threadIdx.x != 0) return;
  const uint32_t bar = wgmma::SmemAddr(smem + slice);
  wgmma::MbarInit(bar, 1);
  wgmma::MbarInitFence();
  const uint64_t t0 = GlobalTimerNs();
  wgmma::MbarArriveExpectTx(bar, static_cast<uint32_t>(slice));
  const int piece = slice / kPieces;
  for (int i = 0; i < kPieces; ++i)
    wgmma::BulkCopy(wgmma::SmemAddr(smem + i * piece), src + static_cast<int64_t>(blockIdx.x) * slice + i * piece,
                    static_cast<uint32_t>(piece), bar, wgmma::EvictFirst());
  wgmma::MbarWait(bar, 0);
  atomicMin(&t[0], static_cast<unsigned long long>(t0));
  atomicMax(&t[1], static_cast<unsigned long long>(GlobalTimerNs()));
}

// Warp 0 of CTA b prefetches its share of [src, src + bytes) in 32 KB pieces, evict-last
// (`last`) or evict-normal.
__global__ void PrefetchKernel(const uint8_t* src, int64_t bytes, bool last) {
  if (threadIdx.x >= 32) return;
  const int64_t share = (bytes / 16 + gridDim.x - 1) / gridDim.x * 16;
  const int64_t begin = blockIdx.x * share, end = min(bytes, begin + share);
  const uint64_t policy = last ? wgmma::EvictLast() : wgmma::EvictNormal();
  constexpr int64_t kChunk = 32 * 1024;
  for (int64_t at = begin + threadIdx.x * kChunk; at < end; at += 32 * kChunk)
    wgmma::PrefetchL2(src + at, static_cast<uint32_t>(min(kChunk, end - at)), policy);
}

// Every thread reads 16-byte pieces of [src, src + bytes) grid-strided: evict-first like the MoE
// kernels' weights (`streaming`), or with the normal policy. sink is written only on a value
// that cannot occur, to keep the loads.
__global__ void StreamKernel(const uint4* src, int64_t n, bool streaming, unsigned* sink) {
  unsigned acc = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 v = streaming ? __ldcs(src + i) : __ldcg(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// The lines of [p, p + bytes) back to the normal eviction priority (after an evict-last case).
__global__ void DemoteKernel(const uint8_t* p, int64_t bytes) {
  for (int64_t at = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * 128; at < bytes;
       at += int64_t{gridDim.x} * blockDim.x * 128)
    asm volatile("applypriority.global.L2::evict_normal [%0], 128;\n" ::"l"(p + at) : "memory");
}

__global__ void DelayKernel(uint64_t ns) {
  const uint64_t until = GlobalTimerNs() + ns;
  while (GlobalTimerNs() < until) {
  }
}

// LaunchL2Gap's kernel: warp 0's lanes prefetch the CTA's share of each range in 32 KB pieces,
// then every thread waits out the gap.
__global__ void GapKernel(const L2Ranges r, uint64_t ns) {
  const uint64_t until = GlobalTimerNs() + ns;
  if (threadIdx.x < 32) {
    constexpr int64_t kChunk = 32 * 1024;
    for (int i = 0; i < r.n; ++i) {
      const auto* src = static_cast<const uint8_t*>(r.p[i]);
      const int64_t share = (r.bytes[i] / 16 + gridDim.x - 1) / gridDim.x * 16;
      const int64_t begin = blockIdx.x * share, end = min(r.bytes[i], begin + share);
      for (int64_t at = begin + threadIdx.x * kChunk; at < end; at += 32 * kChunk)
        wgmma::PrefetchL2(src + at, static_cast<uint32_t>(min(kChunk, end - at)), wgmma::EvictNormal());
    }
  }
  while (GlobalTimerNs() < until) {
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

L2RetentionProbe RunL2RetentionProbe(void* buf, int64_t buf_bytes, int64_t region_bytes, int64_t stream_bytes,
                                     int rounds, cudaStream_t s) {
  int device = 0, sms = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t slice = region_bytes / sms / (16 * kPieces) * (16 * kPieces);
  const int64_t need = kFlushBytes + kMaxStream + kSliceStride * kCases * rounds;
  COROLLA_CHECK(slice > 0 && slice <= kMaxSlice && stream_bytes <= kMaxStream && rounds > 0 && buf_bytes >= need &&
                region_bytes <= kSliceStride)
      << "L2 retention probe: region " << region_bytes << ", stream " << stream_bytes << ", buffer " << buf_bytes;
  auto* base = static_cast<uint8_t*>(buf);
  const uint8_t* flush = base;
  const uint8_t* stream = base + kFlushBytes;
  auto slice_at = [&](int round, int c) { return base + kFlushBytes + kMaxStream + kSliceStride * (round * kCases + c); };
  const int smem = static_cast<int>(slice) + 64;
  COROLLA_CUDA_CHECK(cudaFuncSetAttribute(StagedReadKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  unsigned long long* t = nullptr;
  unsigned* sink = nullptr;
  COROLLA_CUDA_CHECK(cudaMalloc(&t, 2 * sizeof(unsigned long long)));
  COROLLA_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  const int64_t bytes = slice * sms;

  auto read_us = [&](const uint8_t* p) {
    const unsigned long long init[2] = {~0ull, 0ull};
    COROLLA_CUDA_CHECK(cudaMemcpyAsync(t, init, sizeof(init), cudaMemcpyHostToDevice, s));
    StagedReadKernel<<<sms, 32, smem, s>>>(p, static_cast<int>(slice), t);
    COROLLA_CUDA_CHECK(cudaGetLastError());
    unsigned long long out[2];
    COROLLA_CUDA_CHECK(cudaMemcpyAsync(out, t, sizeof(out), cudaMemcpyDeviceToHost, s));
    COROLLA_CUDA_CHECK(cudaStreamSynchronize(s));
    return static_cast<double>(out[1] - out[0]) * 1e-3;
  };
  auto stream_read = [&](const uint8_t* p, int64_t n, bool streaming) {
    StreamKernel<<<sms * 4, 256, 0, s>>>(reinterpret_cast<const uint4*>(p), n / 16, streaming, sink);
    COROLLA_CUDA_CHECK(cudaGetLastError());
  };
  auto flush_l2 = [&] { stream_read(flush, kFlushBytes, false); };
  auto prefetch = [&](const uint8_t* p, bool last) {
    PrefetchKernel<<<sms, 32, 0, s>>>(p, bytes, last);
    COROLLA_CUDA_CHECK(cudaGetLastError());
  };
  auto demote = [&](const uint8_t* p) {
    DemoteKernel<<<sms * 4, 256, 0, s>>>(p, bytes);
    COROLLA_CUDA_CHECK(cudaGetLastError());
  };

  std::vector<double> cold, hot, pre, last_stream, normal_stream, last_normal;
  for (int r = 0; r < rounds; ++r) {
    flush_l2();
    cold.push_back(read_us(slice_at(r, 0)));
    hot.push_back(read_us(slice_at(r, 0)));
    struct Case {
      bool last;
      int stream;  // 0 none (a 30 us pause for the prefetch), 1 evict-first, 2 normal
      std::vector<double>* out;
    };
    const Case cases[] = {{true, 0, &pre}, {true, 1, &last_stream}, {false, 1, &normal_stream}, {true, 2, &last_normal}};
    for (int c = 0; c < 4; ++c) {
      const uint8_t* p = slice_at(r, c + 1);
      flush_l2();
      prefetch(p, cases[c].last);
      if (cases[c].stream == 0) {
        DelayKernel<<<1, 1, 0, s>>>(30'000);
        COROLLA_CUDA_CHECK(cudaGetLastError());
      } else {
        stream_read(stream, stream_bytes, cases[c].stream == 1);
      }
      cases[c].out->push_back(read_us(p));
      demote(p);
    }
  }
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(s));
  COROLLA_CUDA_CHECK(cudaFree(t));
  COROLLA_CUDA_CHECK(cudaFree(sink));
  L2RetentionProbe r;
  r.cold_us = Median(cold);
  r.hot_us = Median(hot);
  r.prefetched_us = Median(pre);
  r.last_stream_us = Median(last_stream);
  r.normal_stream_us = Median(normal_stream);
  r.last_normal_stream_us = Median(last_normal);
  r.region_mb = static_cast<double>(bytes) / (1 << 20);
  return r;
}

void LaunchL2Gap(const L2Ranges& prefetch, uint64_t ns, int ctas, cudaStream_t s) {
  COROLLA_CHECK(prefetch.n >= 0 && prefetch.n <= L2Ranges::kMax && ctas > 0) << "L2 gap: " << prefetch.n << " ranges";
  GapKernel<<<ctas, 32, 0, s>>>(prefetch, ns);
  COROLLA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace corolla::cuda
