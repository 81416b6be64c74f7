#include "parallel/cuda/nvl_copy.h"

#include <nccl_device.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "parallel/cuda/nccl_handle.h"
#include "parallel/cuda/symmetric.h"

namespace corolla {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // 16-byte vectors per thread in flight

// Window layout on every rank: [source bytes][destination bytes]. Push: this rank's source into
// the peer's destination; pull: the peer's source into this rank's destination.
__global__ void __launch_bounds__(kThreads) PeerCopyKernel(ncclWindow_t window, int64_t vecs, int peer, bool pull) {
  const size_t dst_base = static_cast<size_t>(vecs) * 16;
  const uint4* src = static_cast<const uint4*>(pull ? ncclGetLsaPointer(window, 0, peer) : ncclGetLocalPointer(window, 0));
  uint4* dst = static_cast<uint4*>(pull ? ncclGetLocalPointer(window, dst_base) : ncclGetLsaPointer(window, dst_base, peer));
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t v0 = blockIdx.x * int64_t{kThreads} + threadIdx.x; v0 < vecs; v0 += stride * kUnroll) {
    uint4 r[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j)
      if (v0 + j * stride < vecs) r[j] = __ldcg(src + v0 + j * stride);
#pragma unroll
    for (int j = 0; j < kUnroll; ++j)
      if (v0 + j * stride < vecs) __stcg(dst + v0 + j * stride, r[j]);
  }
}

double Median(std::vector<float> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

Result<PeerCopyRate> BenchPeerCopy(Communicator& comm, int64_t bytes, int iters) {
  std::optional<NcclHandle> h = NcclHandleOf(comm);
  if (!h) return InvalidArgument("BenchPeerCopy needs an NCCL communicator");
  if (bytes <= 0 || bytes % 16 != 0) return InvalidArgument("BenchPeerCopy: bytes must be a positive multiple of 16");
  PeerCopyRate rate;
  if (h->size < 2) return rate;
  // Progress on stderr (unbuffered): where a rank stopped, if a step never returns.
  auto progress = [&](const char* what) { std::fprintf(stderr, "peer copy, rank %d: %s\n", h->rank, what); };
  ASSIGN_OR_RETURN(std::unique_ptr<SymmetricMemory> mem, SymmetricMemory::Create(h->comm, 2 * static_cast<size_t>(bytes), 1));
  progress("window made");
  const int next = (h->rank + 1) % h->size, prev = (h->rank + h->size - 1) % h->size;
  int device = 0, sms = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // NCCL's send/recv between plain allocations (the first GPU run of it on the window's memory
  // never returned).
  void *send = nullptr, *recv = nullptr;
  COROLLA_CUDA_CHECK(cudaMalloc(&send, bytes));
  COROLLA_CUDA_CHECK(cudaMalloc(&recv, bytes));
  cudaEvent_t start, stop;
  COROLLA_CUDA_CHECK(cudaEventCreate(&start));
  COROLLA_CUDA_CHECK(cudaEventCreate(&stop));
  cudaStream_t s = h->stream;
  // One NCCL all-reduce of a few bytes lines the ranks up before each timed copy, so a rank's
  // time does not include waiting for a late peer (the copy kernels themselves never wait).
  float* token = nullptr;
  COROLLA_CUDA_CHECK(cudaMalloc(&token, sizeof(float)));
  auto align = [&] { COROLLA_NCCL_CHECK(ncclAllReduce(token, token, 1, ncclFloat32, ncclSum, h->comm, s)); };
  auto time = [&](auto&& copy) {
    std::vector<float> ms;
    for (int i = 0; i < iters + 3; ++i) {
      align();
      COROLLA_CUDA_CHECK(cudaEventRecord(start, s));
      copy();
      COROLLA_CUDA_CHECK(cudaEventRecord(stop, s));
      COROLLA_CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      COROLLA_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      if (i >= 3) ms.push_back(t);
    }
    align();
    COROLLA_CUDA_CHECK(cudaStreamSynchronize(s));
    return static_cast<double>(bytes) / (Median(ms) * 1e-3) / 1e9;
  };
  const int64_t vecs = bytes / 16;
  for (bool pull : {false, true}) {
    const double gbs = time([&] {
      PeerCopyKernel<<<sms * 2, kThreads, 0, s>>>(mem->window(), vecs, next, pull);
      COROLLA_CUDA_CHECK(cudaGetLastError());
    });
    (pull ? rate.pull_gbs : rate.push_gbs) = gbs;
    const std::string line = std::string(pull ? "pull" : "push") + " kernel " + std::to_string(gbs) + " GB/s";
    progress(line.c_str());
  }
  rate.nccl_gbs = time([&] {
    COROLLA_NCCL_CHECK(ncclGroupStart());
    COROLLA_NCCL_CHECK(ncclSend(send, static_cast<size_t>(bytes), ncclUint8, next, h->comm, s));
    COROLLA_NCCL_CHECK(ncclRecv(recv, static_cast<size_t>(bytes), ncclUint8, prev, h->comm, s));
    COROLLA_NCCL_CHECK(ncclGroupEnd());
  });
  progress("nccl send/recv timed");
  COROLLA_CUDA_CHECK(cudaEventDestroy(start));
  COROLLA_CUDA_CHECK(cudaEventDestroy(stop));
  COROLLA_CUDA_CHECK(cudaFree(token));
  COROLLA_CUDA_CHECK(cudaFree(send));
  COROLLA_CUDA_CHECK(cudaFree(recv));
  return rate;  // mem's destructor is collective: every rank reaches it here
}

}  // namespace corolla
