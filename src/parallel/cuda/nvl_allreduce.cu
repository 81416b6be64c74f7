#include "parallel/cuda/nvl_allreduce.h"

#include <nccl_device.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"

namespace corolla {
namespace {

using cuda::bf16_t;

constexpr int kThreads = NvlAllReduce::kThreads;
constexpr int kMaxBlocks = NvlAllReduce::kMaxBlocks;
constexpr int64_t kSlotBytes = NvlAllReduce::kSlotBytes;

struct AllReduceParams {
  ncclDevComm dev_comm;
  ncclWindow_t window;
  void* x;           // [n] T, 16-byte aligned, in place
  int64_t n;         // elements
  int64_t num_vecs;  // 16-byte vectors, the last one maybe partial
  uint32_t* calls;   // [kMaxBlocks]
  int ranks, rank;
};

// 16 bytes of T <-> f32, the partial last vector element by element (x may end anywhere).
template <typename T>
constexpr int kPerVec = 16 / static_cast<int>(sizeof(T));

template <typename T>
__device__ __forceinline__ uint4 LoadX(const AllReduceParams& p, int64_t v) {
  const T* x = static_cast<const T*>(p.x);
  const int64_t first = v * kPerVec<T>;
  if (first + kPerVec<T> <= p.n) return reinterpret_cast<const uint4*>(x)[v];
  uint4 out = make_uint4(0, 0, 0, 0);
  T* o = reinterpret_cast<T*>(&out);
  for (int i = 0; first + i < p.n; ++i) o[i] = x[first + i];
  return out;
}

template <typename T>
__device__ __forceinline__ void StoreX(const AllReduceParams& p, int64_t v, const uint4& val) {
  T* x = static_cast<T*>(p.x);
  const int64_t first = v * kPerVec<T>;
  if (first + kPerVec<T> <= p.n) {
    reinterpret_cast<uint4*>(x)[v] = val;
    return;
  }
  const T* in = reinterpret_cast<const T*>(&val);
  for (int i = 0; first + i < p.n; ++i) x[first + i] = in[i];
}

template <typename T>
__device__ __forceinline__ void Accumulate(float (&acc)[kPerVec<T>], const uint4& v) {
  if constexpr (std::is_same_v<T, float>) {
    acc[0] += __uint_as_float(v.x);
    acc[1] += __uint_as_float(v.y);
    acc[2] += __uint_as_float(v.z);
    acc[3] += __uint_as_float(v.w);
  } else {
    float f[8];
    cuda::Unpack8(reinterpret_cast<const cuda::Bf16x8&>(v), f);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += f[i];
  }
}

template <typename T>
__device__ __forceinline__ uint4 Round(const float (&acc)[kPerVec<T>]) {
  if constexpr (std::is_same_v<T, float>) {
    return make_uint4(__float_as_uint(acc[0]), __float_as_uint(acc[1]), __float_as_uint(acc[2]),
                      __float_as_uint(acc[3]));
  } else {
    const cuda::Bf16x8 b = cuda::Pack8(acc);
    return reinterpret_cast<const uint4&>(b);
  }
}

// Vector v of slot `src` (parity `parity`) on rank `peer`, or in this rank's part.
__device__ __forceinline__ size_t SlotOffset(const AllReduceParams& p, uint32_t parity, int src, int64_t v) {
  return ((static_cast<size_t>(parity) * p.ranks + src) * kSlotBytes) + static_cast<size_t>(v) * 16;
}
__device__ __forceinline__ uint4* PeerVec(const AllReduceParams& p, int peer, uint32_t parity, int src, int64_t v) {
  return static_cast<uint4*>(ncclGetLsaPointer(p.window, SlotOffset(p, parity, src, v), peer));
}
__device__ __forceinline__ uint4 LocalVec(const AllReduceParams& p, uint32_t parity, int src, int64_t v) {
  // L2, not L1: peers wrote it over NVLink since this SM may last have cached the line.
  return __ldcg(static_cast<const uint4*>(ncclGetLocalPointer(p.window, SlotOffset(p, parity, src, v))));
}

// Sum of vector v over the ranks in rank order (own part from x, the peers' from the slots).
template <typename T>
__device__ __forceinline__ uint4 SumVec(const AllReduceParams& p, uint32_t parity, int64_t v) {
  float acc[kPerVec<T>];
#pragma unroll
  for (int i = 0; i < kPerVec<T>; ++i) acc[i] = 0.0f;
  for (int src = 0; src < p.ranks; ++src) Accumulate<T>(acc, src == p.rank ? LoadX<T>(p, v) : LocalVec(p, parity, src, v));
  return Round<T>(acc);
}

// Block b: chunks b, b + kMaxBlocks, ... (4 KiB each; thread t takes vector t of a chunk).
// Two-shot: chunk c is reduced by rank (c / kMaxBlocks) % ranks, its owner.
template <typename T, bool kTwoShot>
__global__ void __launch_bounds__(kThreads) NvlAllReduceKernel(const __grid_constant__ AllReduceParams p) {
  const int b = blockIdx.x;
  const uint32_t call = p.calls[b];
  const uint32_t parity = call & 1;
  const int64_t num_chunks = (p.num_vecs + kThreads - 1) / kThreads;
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), p.dev_comm, ncclTeamLsa(p.dev_comm), p.dev_comm.lsaBarrier,
                                         static_cast<uint32_t>(b)};
  auto owner = [&](int64_t c) { return static_cast<int>((c / kMaxBlocks) % p.ranks); };
  // Push: every peer gets the vector (one-shot) or only the chunk's owner (two-shot).
  for (int64_t c = b; c < num_chunks; c += kMaxBlocks) {
    const int64_t v = c * kThreads + threadIdx.x;
    if (v >= p.num_vecs || (kTwoShot && owner(c) == p.rank)) continue;
    const uint4 val = LoadX<T>(p, v);
    for (int peer = 0; peer < p.ranks; ++peer)
      if (peer != p.rank && (!kTwoShot || peer == owner(c))) *PeerVec(p, peer, parity, p.rank, v) = val;
  }
  bar.sync(ncclCoopCta(), ::cuda::memory_order_acq_rel);
  if constexpr (!kTwoShot) {
    for (int64_t c = b; c < num_chunks; c += kMaxBlocks) {
      const int64_t v = c * kThreads + threadIdx.x;
      if (v < p.num_vecs) StoreX<T>(p, v, SumVec<T>(p, parity, v));
    }
  } else {
    // The owner sums its chunks and pushes the sums into its own slot on every peer (that slot's
    // vectors of chunks this rank owns were not used by the first push).
    for (int64_t c = b; c < num_chunks; c += kMaxBlocks) {
      const int64_t v = c * kThreads + threadIdx.x;
      if (v >= p.num_vecs || owner(c) != p.rank) continue;
      const uint4 sum = SumVec<T>(p, parity, v);
      for (int peer = 0; peer < p.ranks; ++peer)
        if (peer != p.rank) *PeerVec(p, peer, parity, p.rank, v) = sum;
      StoreX<T>(p, v, sum);
    }
    bar.sync(ncclCoopCta(), ::cuda::memory_order_acq_rel);
    for (int64_t c = b; c < num_chunks; c += kMaxBlocks) {
      const int64_t v = c * kThreads + threadIdx.x;
      if (v < p.num_vecs && owner(c) != p.rank) StoreX<T>(p, v, LocalVec(p, parity, owner(c), v));
    }
  }
  // Every thread read `call` before the barrier above; the next call of this block flips parity.
  if (threadIdx.x == 0) p.calls[b] = call + 1;
}

}  // namespace

Result<std::unique_ptr<NvlAllReduce>> NvlAllReduce::Create(ncclComm_t comm, int size, int rank) {
  if (size > kMaxRanks)
    return Unsupported("NVLink all-reduce: " + std::to_string(size) + " ranks (at most " + std::to_string(kMaxRanks) + ")");
  auto ar = std::unique_ptr<NvlAllReduce>(new NvlAllReduce());
  ar->size_ = size;
  ar->rank_ = rank;
  ASSIGN_OR_RETURN(ar->mem_, SymmetricMemory::Create(comm, 2 * size * static_cast<size_t>(kSlotBytes), kMaxBlocks));
  COROLLA_CUDA_CHECK(cudaMalloc(&ar->calls_, kMaxBlocks * sizeof(uint32_t)));
  COROLLA_CUDA_CHECK(cudaMemset(ar->calls_, 0, kMaxBlocks * sizeof(uint32_t)));
  COROLLA_CUDA_CHECK(cudaDeviceSynchronize());
  return Result<std::unique_ptr<NvlAllReduce>>(std::move(ar));
}

NvlAllReduce::~NvlAllReduce() {
  mem_.reset();  // waits for the device first
  if (calls_ != nullptr) cudaFree(calls_);
}

bool NvlAllReduce::Supports(const TensorView& x) {
  return x.device == Device::kCuda && x.is_contiguous() && (x.dtype == DType::kBF16 || x.dtype == DType::kF32) &&
         reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
}

void NvlAllReduce::Run(const TensorView& x, bool two_shot, cudaStream_t stream) {
  COROLLA_CHECK(Supports(x)) << "NVLink all-reduce of " << x.ToString() << " (bf16/f32, contiguous, 16-byte aligned)";
  const int64_t elem = DTypeSize(x.dtype), piece_elems = kSlotBytes / elem;
  for (int64_t first = 0; first < x.numel(); first += piece_elems) {
    const int64_t n = std::min(piece_elems, x.numel() - first);
    AllReduceParams p{mem_->dev_comm(), mem_->window(), static_cast<char*>(x.data) + first * elem, n,
                      (n * elem + 15) / 16, calls_, size_, rank_};
    const int64_t num_chunks = (p.num_vecs + kThreads - 1) / kThreads;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(num_chunks, kMaxBlocks));
    auto launch = [&](auto kernel) {
      kernel<<<blocks, kThreads, 0, stream>>>(p);
      COROLLA_CUDA_CHECK_LAUNCH();
    };
    if (x.dtype == DType::kBF16) {
      two_shot ? launch(NvlAllReduceKernel<bf16_t, true>) : launch(NvlAllReduceKernel<bf16_t, false>);
    } else {
      two_shot ? launch(NvlAllReduceKernel<float, true>) : launch(NvlAllReduceKernel<float, false>);
    }
  }
}

}  // namespace corolla
