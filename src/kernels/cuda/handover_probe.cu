// RunHandoverProbe (handover_probe.h): three handovers of the batch-1 decode step, timed by the
// global timer, while a copier grid on another stream keeps bulk copies in flight as the staged
// GEMVs' and the MoE's weight streams do:
// - the programmatic dependent launch's release: kernel A (one CTA) triggers its dependent at
//   once, idles 3 us so that B is resident and waiting, and stamps its exit; B stamps the return
//   of its griddepcontrol.wait (the timeline's "release" of a decode kernel);
// - a flag between two CTAs of one grid: CTA 0 stamps and stores the round with release
//   semantics, CTA 1 polls it with acquire loads, stamps, and acknowledges (the handover a
//   persistent kernel would use instead of a kernel boundary); again with the stamps kept in
//   shared memory (no global store before the release), and with relaxed stores and polls (a
//   flag carried in the data it hands over, as NCCL's LL protocol: no fence);
// - the L2 round trip: CTA 1 walks a chain of dependent ld.global.cg loads over 64 lines.
#include "kernels/cuda/handover_probe.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

using wgmma::GlobalTimerNs;

constexpr int kStages = 4;                     // copies in flight a copier CTA
constexpr uint64_t kTimeoutNs = 200'000'000;   // a probe waits no longer for a peer (0.2 s)
constexpr int kChainLines = 64, kChainStride = 32;  // one 128-byte line a link
constexpr int kChainLoads = 512;
constexpr int kMaxRounds = 64;  // FlagKernel's stamps in shared memory

// A copier CTA's shared memory before its mbarriers: its stages, at least 120 KB so that one
// copier CTA takes an SM (the probes' CTAs still fit beside it).
__host__ __device__ constexpr int CopierStageBytes(int chunk) {
  return kStages * chunk > 120 * 1024 ? kStages * chunk : 120 * 1024;
}

struct ProbeState {
  unsigned started;  // copier CTAs running
  unsigned stop;     // set after the probes: the copiers drain and exit
  unsigned timed_out;
  unsigned flag, ack;  // FlagKernel's: each flag's ack follows it
  unsigned flag_clean, ack_clean;
  unsigned flag_relaxed, ack_relaxed;
  unsigned long long copied;          // bytes the copiers landed
  unsigned long long copy_t0, copy_t1;  // earliest copier start, latest end (ns)
};

__device__ __forceinline__ unsigned LoadAcquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void StoreRelease(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// One thread a CTA: kStages bulk copies of `chunk` bytes in flight into shared memory, walking
// the CTA's `region` of src cyclically (evict-first, as the staged GEMV's copies), until stop.
__global__ void __launch_bounds__(32, 1) CopierKernel(const uint8_t* src, int64_t region, int chunk, ProbeState* st) {
  extern __shared__ __align__(128) uint8_t smem[];
  if (threadIdx.x != 0) return;
  const uint32_t bars = wgmma::SmemAddr(smem + CopierStageBytes(chunk));
  for (int i = 0; i < kStages; ++i) wgmma::MbarInit(bars + 8 * i, 1);
  wgmma::MbarInitFence();
  const uint8_t* base = src + region * blockIdx.x;
  const int64_t pieces = region / chunk;
  const uint64_t t0 = GlobalTimerNs();
  atomicAdd(&st->started, 1u);
  int64_t issued = 0, landed = 0;
  auto issue = [&] {
    const int slot = static_cast<int>(issued % kStages);
    wgmma::MbarArriveExpectTx(bars + 8 * slot, static_cast<uint32_t>(chunk));
    wgmma::BulkCopy(wgmma::SmemAddr(smem + static_cast<int64_t>(slot) * chunk), base + (issued % pieces) * chunk,
                    static_cast<uint32_t>(chunk), bars + 8 * slot, wgmma::EvictFirst());
    ++issued;
  };
  auto land = [&] {
    const int slot = static_cast<int>(landed % kStages);
    wgmma::MbarWait(bars + 8 * slot, static_cast<uint32_t>((landed / kStages) & 1));
    ++landed;
  };
  for (int i = 0; i < kStages; ++i) issue();
  for (;;) {
    land();
    if (LoadAcquire(&st->stop) != 0) break;
    issue();
  }
  while (landed < issued) land();  // no CTA exits with copies still landing in its shared memory
  atomicAdd(&st->copied, static_cast<unsigned long long>(landed) * chunk);
  atomicMin(&st->copy_t0, t0);
  atomicMax(&st->copy_t1, GlobalTimerNs());
}

__global__ void WaitStartedKernel(ProbeState* st, unsigned ctas) {
  if (threadIdx.x != 0) return;
  const uint64_t deadline = GlobalTimerNs() + kTimeoutNs;
  while (LoadAcquire(&st->started) < ctas)
    if (GlobalTimerNs() > deadline) {
      st->timed_out = 1;
      return;
    }
}

__global__ void ReleaseAKernel(uint64_t* stamps, int i) {
  TriggerDependents();  // B launches now and sits at its wait
  if (threadIdx.x != 0) return;
  const uint64_t until = GlobalTimerNs() + 3000;
  while (GlobalTimerNs() < until) {
  }
  stamps[2 * i] = GlobalTimerNs();  // the last thing A does
}

__global__ void ReleaseBKernel(uint64_t* stamps, int i) {
  GridDependencyWait();
  if (threadIdx.x == 0) stamps[2 * i + 1] = GlobalTimerNs();
}

__device__ __forceinline__ unsigned LoadRelaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void StoreRelaxed(unsigned* p, unsigned v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// How a flag goes between the two CTAs of FlagKernel.
enum FlagMode : int {
  kFlagRelease = 0,  // each side stamps to global memory, then stores the flag with release
  kFlagClean = 1,    // the same release, the stamps kept in shared memory (no global store before)
  kFlagRelaxed = 2,  // relaxed store and polls, as a flag carried in the data (NCCL's LL protocol)
};

// Two CTAs (one thread each): the flag ping-pong of `mode`, then (kFlagRelease) CTA 1's L2 chain.
__global__ void FlagKernel(ProbeState* st, uint64_t* stamps, int rounds, int mode, const unsigned* chain,
                           uint64_t* trip_ns) {
  __shared__ uint64_t local[kMaxRounds];
  if (threadIdx.x != 0) return;
  unsigned* flag = mode == kFlagRelease ? &st->flag
                   : mode == kFlagClean ? &st->flag_clean
                                        : &st->flag_relaxed;
  unsigned* ack = flag + 1;
  const uint64_t deadline = GlobalTimerNs() + kTimeoutNs;
  auto spin = [&](const unsigned* p, unsigned want) {
    while ((mode == kFlagRelaxed ? LoadRelaxed(p) : LoadAcquire(p)) != want)
      if (GlobalTimerNs() > deadline) {  // the peer, if it runs, gives up by its own deadline too
        st->timed_out = 1;
        return false;
      }
    return true;
  };
  auto stamp = [&](int i) {
    if (mode == kFlagRelease) stamps[i] = GlobalTimerNs();
    else local[i / 2] = GlobalTimerNs();  // this CTA's stamps are every other one
  };
  for (int r = 1; r <= rounds; ++r) {
    const bool first = blockIdx.x == 0;
    if (!spin(first ? ack : flag, first ? r - 1 : r)) return;
    stamp(2 * (r - 1) + (first ? 0 : 1));
    if (mode == kFlagRelaxed) StoreRelaxed(first ? flag : ack, r);
    else StoreRelease(first ? flag : ack, r);
  }
  if (mode != kFlagRelease) {
    for (int r = 0; r < rounds; ++r) stamps[2 * r + blockIdx.x] = local[r];
    return;
  }
  if (blockIdx.x == 0) return;
  unsigned idx = 0;
  for (int i = 0; i < kChainLines; ++i) idx = __ldcg(chain + idx * kChainStride);  // into L2
  const uint64_t t0 = GlobalTimerNs();
  for (int i = 0; i < kChainLoads; ++i) idx = __ldcg(chain + idx * kChainStride);
  const uint64_t t1 = GlobalTimerNs();
  *trip_ns = (t1 - t0) + (idx == 0xffffffffu ? 1 : 0);  // idx keeps the chain live
}

__global__ void StopKernel(ProbeState* st) {
  if (threadIdx.x == 0) StoreRelease(&st->stop, 1u);
}

double MedianUs(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2] * 1e-3;
}

}  // namespace

HandoverProbe RunHandoverProbe(const void* src, int64_t src_bytes, int copier_ctas, int chunk_bytes, int rounds,
                               cudaStream_t s, cudaStream_t side) {
  int device = 0, sms = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  COROLLA_CHECK(copier_ctas >= 0 && copier_ctas <= sms - 4 && rounds > 0 && rounds <= kMaxRounds &&
                chunk_bytes % 16 == 0 && (copier_ctas == 0 || src_bytes / copier_ctas >= chunk_bytes))
      << "handover probe: " << copier_ctas << " copier CTAs of " << sms << " SMs, chunk " << chunk_bytes;
  ProbeState* st = nullptr;
  uint64_t* stamps = nullptr;  // [rounds][2] release, then [rounds][2] for each flag mode, then the trip
  unsigned* chain = nullptr;
  COROLLA_CUDA_CHECK(cudaMalloc(&st, sizeof(ProbeState)));
  COROLLA_CUDA_CHECK(cudaMalloc(&stamps, sizeof(uint64_t) * (8 * rounds + 1)));
  COROLLA_CUDA_CHECK(cudaMalloc(&chain, sizeof(unsigned) * kChainLines * kChainStride));
  ProbeState init{};
  init.copy_t0 = ~0ull;
  COROLLA_CUDA_CHECK(cudaMemcpyAsync(st, &init, sizeof(init), cudaMemcpyHostToDevice, s));
  std::vector<unsigned> links(kChainLines * kChainStride, 0);
  for (int i = 0; i < kChainLines; ++i) links[i * kChainStride] = (i * 37 + 1) % kChainLines;  // 37: coprime, a full cycle
  COROLLA_CUDA_CHECK(cudaMemcpyAsync(chain, links.data(), links.size() * sizeof(unsigned), cudaMemcpyHostToDevice, s));
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(s));

  if (copier_ctas > 0) {
    const int smem = CopierStageBytes(chunk_bytes) + 8 * kStages;
    COROLLA_CUDA_CHECK(cudaFuncSetAttribute(CopierKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int64_t region = src_bytes / copier_ctas / chunk_bytes * chunk_bytes;
    CopierKernel<<<copier_ctas, 32, smem, side>>>(static_cast<const uint8_t*>(src), region, chunk_bytes, st);
    COROLLA_CUDA_CHECK(cudaGetLastError());
  }
  WaitStartedKernel<<<1, 32, 0, s>>>(st, static_cast<unsigned>(copier_ctas));
  for (int i = 0; i < rounds; ++i) {
    ReleaseAKernel<<<1, 32, 0, s>>>(stamps, i);
    LaunchPdl(ReleaseBKernel, dim3(1), dim3(32), 0, s, 1, stamps, i);
  }
  for (int mode : {kFlagRelease, kFlagClean, kFlagRelaxed})
    FlagKernel<<<2, 32, 0, s>>>(st, stamps + 2 * rounds * (1 + mode), rounds, mode, chain,
                                stamps + 8 * rounds);
  StopKernel<<<1, 32, 0, s>>>(st);
  COROLLA_CUDA_CHECK(cudaGetLastError());
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(s));
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(side));

  ProbeState out{};
  std::vector<uint64_t> t(8 * rounds + 1);
  COROLLA_CUDA_CHECK(cudaMemcpy(&out, st, sizeof(out), cudaMemcpyDeviceToHost));
  COROLLA_CUDA_CHECK(cudaMemcpy(t.data(), stamps, t.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  COROLLA_CUDA_CHECK(cudaFree(st));
  COROLLA_CUDA_CHECK(cudaFree(stamps));
  COROLLA_CUDA_CHECK(cudaFree(chain));

  HandoverProbe r;
  r.timed_out = out.timed_out != 0;
  if (r.timed_out) return r;
  // Section k's handover i: from stamp 2 i to stamp 2 i + 1.
  auto median = [&](int k) {
    std::vector<double> v;
    for (int i = 0; i < rounds; ++i)
      v.push_back(static_cast<double>(t[2 * rounds * k + 2 * i + 1]) -
                  static_cast<double>(t[2 * rounds * k + 2 * i]));
    return MedianUs(v);
  };
  r.pdl_release_us = median(0);
  r.flag_us = median(1 + kFlagRelease);
  r.flag_clean_us = median(1 + kFlagClean);
  r.flag_relaxed_us = median(1 + kFlagRelaxed);
  r.l2_trip_us = static_cast<double>(t[8 * rounds]) * 1e-3 / kChainLoads;
  if (copier_ctas > 0 && out.copy_t1 > out.copy_t0)
    r.copy_gbs = static_cast<double>(out.copied) / static_cast<double>(out.copy_t1 - out.copy_t0);  // bytes/ns
  return r;
}

}  // namespace corolla::cuda
