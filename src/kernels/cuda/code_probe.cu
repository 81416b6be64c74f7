// RunColdCodeProbe (code_probe.h): straight-line kernels of 4 / 16 / 64 KB, warm, after a 256 KB
// kernel on every SM, and after that and an L2 flush.
#include <algorithm>
#include <vector>

#include "kernels/cuda/code_probe.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

constexpr int kProbeThreads = 128;                 // a warp a scheduler
constexpr int kAccumulators = 8;                   // independent chains: FMA latency hidden
constexpr int kOpsPerKb = 1024 / 16;               // a Hopper instruction is 16 bytes
constexpr int kThrashKb = 256;                     // past an SM's instruction caches
constexpr size_t kFlushBytes = size_t{256} << 20;  // past the L2

// kOps FMAs with distinct immediates (no two the same instruction), kAccumulators chains;
// t[2 * blockIdx.x] the CTA's ns from its first timed instruction to its last, t[2 * .. + 1] its
// cycles (thread 0's, after the CTA's barrier). out keeps the arithmetic alive.
template <int kOps>
__global__ void __launch_bounds__(kProbeThreads)
    StraightLineKernel(const float* in, float* out, unsigned long long* t) {
  float a[kAccumulators];
#pragma unroll
  for (int k = 0; k < kAccumulators; ++k) a[k] = in[k];
  const uint64_t ns0 = wgmma::GlobalTimerNs();
  const long long c0 = clock64();
  // x through a volatile asm after the timers: no FMA can move above them.
  float x;
  asm volatile("mov.b32 %0, %1;" : "=f"(x) : "f"(in[kAccumulators]));
#pragma unroll
  for (int i = 0; i < kOps; ++i)
    a[i % kAccumulators] = fmaf(a[i % kAccumulators], x, static_cast<float>(i));
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < kAccumulators; ++k) sum += a[k];
  asm volatile("mov.b32 %0, %0;" : "+f"(sum));  // every FMA before the timers below
  __syncthreads();
  if (threadIdx.x == 0 && t != nullptr) {
    t[2 * blockIdx.x] = wgmma::GlobalTimerNs() - ns0;
    t[2 * blockIdx.x + 1] = static_cast<unsigned long long>(clock64() - c0);
  }
  out[blockIdx.x * kProbeThreads + threadIdx.x] = sum;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int SmCount() {
  int device = 0, sms = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

}  // namespace

void ThrashInstructionCaches(cudaStream_t s) {
  static const int ctas = 8 * SmCount();  // several a SM: every SM runs the code
  static float* buf = [] {                // [64] in, then [ctas x kProbeThreads] out (kept)
    float* p = nullptr;
    COROLLA_CUDA_CHECK(
        cudaMalloc(&p, (64 + static_cast<size_t>(ctas) * kProbeThreads) * sizeof(float)));
    COROLLA_CUDA_CHECK(cudaMemset(p, 0, 64 * sizeof(float)));
    return p;
  }();
  StraightLineKernel<kThrashKb * kOpsPerKb><<<ctas, kProbeThreads, 0, s>>>(buf, buf + 64, nullptr);
  COROLLA_CUDA_CHECK(cudaGetLastError());
}

ColdCodeProbe RunColdCodeProbe(int kb, int rounds, cudaStream_t s) {
  COROLLA_CHECK((kb == 4 || kb == 16 || kb == 64) && rounds > 0)
      << "cold code probe: " << kb << " KB";
  const int sms = SmCount();
  float *in = nullptr, *out = nullptr;
  unsigned long long* t = nullptr;
  void* flush = nullptr;
  COROLLA_CUDA_CHECK(cudaMalloc(&in, 64 * sizeof(float)));
  COROLLA_CUDA_CHECK(cudaMemset(in, 0, 64 * sizeof(float)));
  COROLLA_CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(sms) * kProbeThreads * sizeof(float)));
  COROLLA_CUDA_CHECK(cudaMalloc(&t, 2 * static_cast<size_t>(sms) * sizeof(unsigned long long)));
  COROLLA_CUDA_CHECK(cudaMalloc(&flush, kFlushBytes));

  auto probe = [&](unsigned long long* times) {
    if (kb == 4) StraightLineKernel<4 * kOpsPerKb><<<sms, kProbeThreads, 0, s>>>(in, out, times);
    if (kb == 16) StraightLineKernel<16 * kOpsPerKb><<<sms, kProbeThreads, 0, s>>>(in, out, times);
    if (kb == 64) StraightLineKernel<64 * kOpsPerKb><<<sms, kProbeThreads, 0, s>>>(in, out, times);
    COROLLA_CUDA_CHECK(cudaGetLastError());
  };
  auto thrash = [&] { ThrashInstructionCaches(s); };
  // The probe's CTAs' medians (ns, cycles).
  auto timed = [&](std::vector<double>& us, std::vector<double>& cycles) {
    probe(t);
    std::vector<unsigned long long> host(2 * static_cast<size_t>(sms));
    COROLLA_CUDA_CHECK(
        cudaMemcpyAsync(host.data(), t, host.size() * sizeof(host[0]), cudaMemcpyDeviceToHost, s));
    COROLLA_CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<double> ns(sms), cy(sms);
    for (int c = 0; c < sms; ++c) {
      ns[c] = static_cast<double>(host[2 * c]);
      cy[c] = static_cast<double>(host[2 * c + 1]);
    }
    us.push_back(Median(ns) * 1e-3);
    cycles.push_back(Median(cy));
  };

  for (int i = 0; i < 20; ++i) thrash();  // the clocks up from idle
  std::vector<double> warm, icache, l2, warm_c, icache_c, l2_c;
  for (int r = 0; r < rounds; ++r) {
    probe(t);
    timed(warm, warm_c);
    thrash();
    timed(icache, icache_c);
    thrash();
    COROLLA_CUDA_CHECK(cudaMemsetAsync(flush, r & 0xff, kFlushBytes, s));
    timed(l2, l2_c);
  }
  COROLLA_CUDA_CHECK(cudaFree(in));
  COROLLA_CUDA_CHECK(cudaFree(out));
  COROLLA_CUDA_CHECK(cudaFree(t));
  COROLLA_CUDA_CHECK(cudaFree(flush));
  ColdCodeProbe r;
  r.warm_us = Median(warm);
  r.icache_cold_us = Median(icache);
  r.l2_cold_us = Median(l2);
  r.warm_cycles = Median(warm_c);
  r.icache_cold_cycles = Median(icache_c);
  r.l2_cold_cycles = Median(l2_c);
  return r;
}

}  // namespace corolla::cuda
