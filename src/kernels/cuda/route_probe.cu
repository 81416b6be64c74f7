// RunRouteProbe (route_probe.h).
#include "kernels/cuda/route_probe.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe_route.cuh"

namespace corolla::cuda {
namespace {

constexpr int kMaxExperts = 128;

// One warp: each set's logits to shared memory, then the timed call.
__global__ void RouteProbeKernel(const float* logits, int sets, RouteParams p, int mode, long long* cycles,
                                 float* sink) {
  __shared__ float row[kMaxExperts];
  const int lane = threadIdx.x;
  for (int s = 0; s < sets; ++s) {
    for (int e = lane; e < p.experts; e += 32) row[e] = logits[static_cast<int64_t>(s) * p.experts + e];
    __syncwarp();
    const long long t0 = clock64();
    if (mode < 2) {
      uint32_t key[4];
      const bool ok = mode == 0 ? ScoreKeys<4, false>(p, row, lane, key) : ScoreKeys<4, true>(p, row, lane, key);
      sink[s * 32 + lane] = ok ? static_cast<float>(key[0] ^ key[1] ^ key[2] ^ key[3]) : -1.0f;
    } else if (mode == 2) {
      RouteTokenRegs<4, false>(p, s, row, lane);
    } else if (mode == 3) {
      RouteTokenRegs<4, true>(p, s, row, lane);
    } else {
      RouteTokenByLogits<4>(p, s, row, lane);
    }
    const long long t1 = clock64();
    if (lane == 0) cycles[s] = t1 - t0;
    __syncwarp();
  }
}

__device__ __forceinline__ uint64_t SplitMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Thread i's pairs: a a float in [2^-30, 1) (as the scores' exponentials) with a random
// exponent and mantissa, b a double in [1, 128) with every mantissa bit random (as the sums).
__global__ void DivisionCheckKernel(int64_t n, uint64_t seed, unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t za = SplitMix64(seed + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull), zb = SplitMix64(za);
    const float a = __uint_as_float(static_cast<uint32_t>(((97 + (za >> 59) % 30) << 23) | (za & 0x7fffff)));
    const double b =
        __longlong_as_double(static_cast<long long>(0x3ff0000000000000ull | (zb & 0xfffffffffffffull))) *
        static_cast<double>(1u << ((zb >> 60) % 7));
    if (__double_as_longlong(DivideByReciprocal(a, b, 1.0 / b)) != __double_as_longlong(a / b)) ++bad;
  }
  if (bad) atomicAdd(mismatches, bad);
}

}  // namespace

int64_t DivideByReciprocalMismatches(int64_t n, uint64_t seed) {
  unsigned long long* d = nullptr;
  COROLLA_CUDA_CHECK(cudaMalloc(&d, sizeof(*d)));
  COROLLA_CUDA_CHECK(cudaMemset(d, 0, sizeof(*d)));
  DivisionCheckKernel<<<1024, 256>>>(n, seed, d);
  COROLLA_CUDA_CHECK(cudaGetLastError());
  unsigned long long h = 0;
  COROLLA_CUDA_CHECK(cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost));
  COROLLA_CUDA_CHECK(cudaFree(d));
  return static_cast<int64_t>(h);
}

RouteProbe RunRouteProbe(const std::vector<float>& logits, int sets, int experts, int top_k, int mode) {
  COROLLA_CHECK(experts >= top_k && experts <= kMaxExperts && top_k <= 32 && sets >= 1 &&
                logits.size() == static_cast<size_t>(sets) * experts)
      << "route probe: " << sets << " sets of " << experts << " experts, top " << top_k;
  float *d_logits = nullptr, *d_weights = nullptr, *d_sink = nullptr;
  int32_t* d_ids = nullptr;
  long long* d_cycles = nullptr;
  COROLLA_CUDA_CHECK(cudaMalloc(&d_logits, logits.size() * sizeof(float)));
  COROLLA_CUDA_CHECK(cudaMalloc(&d_ids, sizeof(int32_t) * sets * top_k));
  COROLLA_CUDA_CHECK(cudaMalloc(&d_weights, sizeof(float) * sets * top_k));
  COROLLA_CUDA_CHECK(cudaMalloc(&d_sink, sizeof(float) * sets * 32));
  COROLLA_CUDA_CHECK(cudaMalloc(&d_cycles, sizeof(long long) * sets));
  COROLLA_CUDA_CHECK(cudaMemcpy(d_logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
  COROLLA_CUDA_CHECK(cudaMemset(d_ids, 0xff, sizeof(int32_t) * sets * top_k));  // poisoned: -1
  COROLLA_CUDA_CHECK(cudaMemset(d_weights, 0xff, sizeof(float) * sets * top_k));  // NaN
  RouteParams p{};
  p.topk_ids = d_ids;
  p.ids_stride = top_k;
  p.topk_weights = d_weights;
  p.weights_stride = top_k;
  p.tokens = sets;
  p.experts = experts;
  p.top_k = top_k;
  p.renormalize = true;
  p.scaling_factor = 1.0f;
  p.num_groups = p.topk_groups = 1;
  RouteProbeKernel<<<1, 32>>>(d_logits, sets, p, mode, d_cycles, d_sink);
  COROLLA_CUDA_CHECK(cudaGetLastError());
  RouteProbe r;
  r.ids.resize(static_cast<size_t>(sets) * top_k);
  r.weights.resize(r.ids.size());
  std::vector<long long> cycles(sets);
  COROLLA_CUDA_CHECK(cudaMemcpy(r.ids.data(), d_ids, sizeof(int32_t) * r.ids.size(), cudaMemcpyDeviceToHost));
  COROLLA_CUDA_CHECK(cudaMemcpy(r.weights.data(), d_weights, sizeof(float) * r.weights.size(), cudaMemcpyDeviceToHost));
  COROLLA_CUDA_CHECK(cudaMemcpy(cycles.data(), d_cycles, sizeof(long long) * sets, cudaMemcpyDeviceToHost));
  r.cycles.assign(cycles.begin(), cycles.end());
  for (void* q : {static_cast<void*>(d_logits), static_cast<void*>(d_ids), static_cast<void*>(d_weights),
                  static_cast<void*>(d_sink), static_cast<void*>(d_cycles)})
    COROLLA_CUDA_CHECK(cudaFree(q));
  return r;
}

}  // namespace corolla::cuda
