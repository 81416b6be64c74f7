#include "parallel/cuda/ep_kernels.h"

#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"

namespace corolla {
namespace {

using cuda::bf16_t;
using cuda::Bf16x8;

cudaStream_t StreamOf(Backend& backend) {
  auto* cuda_backend = dynamic_cast<cuda::CudaBackend*>(&backend);
  COROLLA_CHECK(cuda_backend != nullptr) << "expert-parallel kernels need the CUDA backend, not " << backend.name();
  return cuda_backend->stream();
}

struct ShiftParams {
  int32_t* ids;
  int64_t row_stride;
  int64_t tokens;
  int top_k;
  int delta;
};

__global__ void ShiftIdsKernel(const __grid_constant__ ShiftParams p) {
  const int64_t n = p.tokens * p.top_k;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p.ids[(i / p.top_k) * p.row_stride + i % p.top_k] += p.delta;
}

// ---- DP-EP routing plan: one block walks the tokens in order, so each destination's rows
// keep token order (deterministic, as the CPU twin). Per chunk of blockDim tokens and per
// rank: a warp ballot gives each token its place in its warp, the warps' totals in shared
// memory its place in the chunk, a running count its place in the block.
constexpr int kPlanMaxThreads = 1024;

struct PlanParams {
  const int32_t* ids;  // [T, K], row stride ids_stride
  int64_t ids_stride;
  int64_t tokens;
  int top_k;
  int experts_per_rank;
  int ranks;
  int32_t* map;     // [T, ranks]
  int32_t* counts;  // [ranks]
};

__global__ void __launch_bounds__(kPlanMaxThreads) EpPlanKernel(const __grid_constant__ PlanParams p) {
  __shared__ int warp_totals[kPlanMaxThreads / 32][kMaxEpRanks];
  __shared__ int running[kMaxEpRanks];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, num_warps = blockDim.x >> 5;
  const unsigned lanes_below = (1u << lane) - 1u;
  const int num_experts = p.experts_per_rank * p.ranks;
  for (int r = tid; r < p.ranks; r += blockDim.x) running[r] = 0;
  __syncthreads();
  for (int64_t base = 0; base < p.tokens; base += blockDim.x) {
    const int64_t t = base + tid;
    uint64_t mask = 0;  // destination ranks of token t
    if (t < p.tokens)
      for (int s = 0; s < p.top_k; ++s) {
        const int e = p.ids[t * p.ids_stride + s];
        if (e >= 0 && e < num_experts) mask |= uint64_t{1} << (e / p.experts_per_rank);
      }
    for (int r = 0; r < p.ranks; ++r) {
      const unsigned ballot = __ballot_sync(0xffffffffu, (mask >> r) & 1);
      if (lane == 0) warp_totals[warp][r] = __popc(ballot);
    }
    __syncthreads();
    for (int r = 0; r < p.ranks; ++r) {
      const bool mine = (mask >> r) & 1;
      const unsigned ballot = __ballot_sync(0xffffffffu, mine);
      if (t < p.tokens) {
        int row = -1;
        if (mine) {
          row = running[r] + __popc(ballot & lanes_below);
          for (int w = 0; w < warp; ++w) row += warp_totals[w][r];
        }
        p.map[t * p.ranks + r] = row;
      }
    }
    __syncthreads();
    for (int r = tid; r < p.ranks; r += blockDim.x) {
      int sum = 0;
      for (int w = 0; w < num_warps; ++w) sum += warp_totals[w][r];
      running[r] += sum;
    }
    __syncthreads();
  }
  for (int r = tid; r < p.ranks; r += blockDim.x) p.counts[r] = running[r];
}

// First row of each destination's block: r * capacity, or after the rows of the ranks before.
__device__ void BlockStarts(const int32_t* counts, int ranks, int capacity, int64_t* start) {
  if (threadIdx.x == 0) {
    int64_t s = 0;
    for (int r = 0; r < ranks; ++r) {
      start[r] = capacity > 0 ? int64_t{r} * capacity : s;
      s += counts[r];
    }
  }
  __syncthreads();
}

// ---- pack: one block per token, one row per destination rank of the token.
struct PackParams {
  const char* x;  // token t's activations at x + t * x_stride_bytes, 16-byte aligned
  int64_t x_stride_bytes;
  int64_t x_bytes;  // a multiple of 16
  const int32_t* ids;
  int64_t ids_stride;
  const float* weights;
  int64_t weights_stride;
  const int32_t* map;
  const int32_t* counts;
  int ranks, top_k, capacity, experts_per_rank;
  int64_t row_bytes, ids_offset, weights_offset;
  char* send;
};

__global__ void EpPackKernel(const __grid_constant__ PackParams p) {
  __shared__ int64_t start[kMaxEpRanks];
  BlockStarts(p.counts, p.ranks, p.capacity, start);
  const int64_t t = blockIdx.x;
  const uint4* src = reinterpret_cast<const uint4*>(p.x + t * p.x_stride_bytes);
  for (int r = 0; r < p.ranks; ++r) {
    const int j = p.map[t * p.ranks + r];
    if (j < 0) continue;
    char* dst = p.send + (start[r] + j) * p.row_bytes;
    for (int64_t i = threadIdx.x; i < p.x_bytes / 16; i += blockDim.x) reinterpret_cast<uint4*>(dst)[i] = src[i];
    for (int s = threadIdx.x; s < p.top_k; s += blockDim.x) {
      const int e = p.ids[t * p.ids_stride + s] - r * p.experts_per_rank;
      reinterpret_cast<int32_t*>(dst + p.ids_offset)[s] = e >= 0 && e < p.experts_per_rank ? e : -1;
      reinterpret_cast<float*>(dst + p.weights_offset)[s] = p.weights[t * p.weights_stride + s];
    }
  }
}

// Fixed capacity: rows [counts[r], capacity) of block r carry no token; ids -1 make the
// receiver's MoeExperts skip them. One block per rank.
__global__ void EpPadKernel(const __grid_constant__ PackParams p) {
  const int r = blockIdx.x;
  const int64_t first = p.counts[r], n = (p.capacity - first) * p.top_k;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    char* dst = p.send + (int64_t{r} * p.capacity + first + i / p.top_k) * p.row_bytes;
    reinterpret_cast<int32_t*>(dst + p.ids_offset)[i % p.top_k] = -1;
    reinterpret_cast<float*>(dst + p.weights_offset)[i % p.top_k] = 0.0f;
  }
}

// ---- combine: one block per token; each thread sums 8 columns over the token's ranks in
// rank order in f32 and rounds once.
struct CombineParams {
  const bf16_t* back;  // [rows, hidden]
  const int32_t* map;
  const int32_t* counts;
  int ranks, capacity;
  int64_t hidden;
  bf16_t* out;
  int64_t out_stride;
};

__global__ void EpCombineKernel(const __grid_constant__ CombineParams p) {
  __shared__ int64_t start[kMaxEpRanks];
  BlockStarts(p.counts, p.ranks, p.capacity, start);
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x; c < p.hidden / 8; c += blockDim.x) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int r = 0; r < p.ranks; ++r) {
      const int j = p.map[t * p.ranks + r];
      if (j < 0) continue;
      float v[8];
      cuda::Unpack8(reinterpret_cast<const Bf16x8*>(p.back + (start[r] + j) * p.hidden)[c], v);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += v[i];
    }
    reinterpret_cast<Bf16x8*>(p.out + t * p.out_stride)[c] = cuda::Pack8(acc);
  }
}

}  // namespace

void ShiftExpertIdsCuda(Backend& backend, const TensorView& ids, int delta) {
  COROLLA_CHECK(ids.device == Device::kCuda && ids.dtype == DType::kI32 && ids.rank() == 2 && ids.strides[1] == 1)
      << "shift expert ids " << ids.ToString() << " on " << backend.name();
  cudaStream_t stream = StreamOf(backend);
  const int64_t n = ids.numel();
  if (n == 0) return;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 1024));
  ShiftParams p{ids.ptr<int32_t>(), ids.strides[0], ids.dim(0), static_cast<int>(ids.dim(1)), delta};
  ShiftIdsKernel<<<blocks, threads, 0, stream>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

void EpPlanCuda(Backend& backend, const TensorView& topk_ids, int experts_per_rank, const TensorView& map,
                const TensorView& counts) {
  COROLLA_CHECK(topk_ids.device == Device::kCuda && map.device == Device::kCuda && counts.device == Device::kCuda &&
                experts_per_rank > 0)
      << "ep plan on the GPU: ids " << topk_ids.ToString() << " map " << map.ToString();
  const int64_t tokens = topk_ids.dim(0);
  // A zero-token plan still runs: it writes the zero counts.
  const int threads = static_cast<int>(std::clamp<int64_t>((tokens + 31) / 32 * 32, 32, kPlanMaxThreads));
  PlanParams p{topk_ids.ptr<int32_t>(), topk_ids.strides[0], tokens, static_cast<int>(topk_ids.dim(1)),
               experts_per_rank, static_cast<int>(map.dim(1)), map.ptr<int32_t>(), counts.ptr<int32_t>()};
  EpPlanKernel<<<1, threads, 0, StreamOf(backend)>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

void EpPackCuda(Backend& backend, const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                const TensorView& map, const TensorView& counts, int capacity, int experts_per_rank,
                const EpRowLayout& layout, const TensorView& send) {
  const int64_t tokens = x.dim(0);
  COROLLA_CHECK(x.device == Device::kCuda && send.device == Device::kCuda && topk_weights.device == Device::kCuda &&
                layout.ids_offset() % 16 == 0 && (tokens <= 1 || (x.strides[0] * DTypeSize(x.dtype)) % 16 == 0) &&
                reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && reinterpret_cast<uintptr_t>(send.data) % 16 == 0)
      << "ep pack on the GPU needs 16-byte rows: x " << x.ToString() << " (row stride " << x.strides[0] << ")";
  cudaStream_t stream = StreamOf(backend);
  PackParams p{static_cast<const char*>(x.data), x.strides[0] * DTypeSize(x.dtype), layout.ids_offset(),
               topk_ids.ptr<int32_t>(), topk_ids.strides[0], topk_weights.ptr<float>(), topk_weights.strides[0],
               map.ptr<int32_t>(), counts.ptr<int32_t>(), static_cast<int>(map.dim(1)),
               static_cast<int>(layout.top_k), capacity, experts_per_rank, layout.row_bytes(), layout.ids_offset(),
               layout.weights_offset(), static_cast<char*>(send.data)};
  if (tokens > 0) {
    EpPackKernel<<<static_cast<unsigned>(tokens), 128, 0, stream>>>(p);
    COROLLA_CUDA_CHECK_LAUNCH();
  }
  if (capacity > 0) {
    EpPadKernel<<<static_cast<unsigned>(map.dim(1)), 256, 0, stream>>>(p);
    COROLLA_CUDA_CHECK_LAUNCH();
  }
}

void EpCombineCuda(Backend& backend, const TensorView& back, const TensorView& map, const TensorView& counts,
                   int capacity, const TensorView& out) {
  const int64_t tokens = out.dim(0), hidden = out.dim(1);
  COROLLA_CHECK(back.device == Device::kCuda && out.device == Device::kCuda && back.dtype == DType::kBF16 &&
                out.dtype == DType::kBF16 && cuda::Vectorisable(out, hidden) && cuda::Vectorisable(back, hidden))
      << "ep combine on the GPU: " << back.ToString() << " into " << out.ToString() << " (bf16, hidden % 8 == 0)";
  if (tokens == 0) return;
  CombineParams p{back.ptr<bf16_t>(), map.ptr<int32_t>(), counts.ptr<int32_t>(), static_cast<int>(map.dim(1)),
                  capacity, hidden, out.ptr<bf16_t>(), out.strides[0]};
  const int threads = static_cast<int>(std::clamp<int64_t>((hidden / 8 + 31) / 32 * 32, 32, 256));
  EpCombineKernel<<<static_cast<unsigned>(tokens), threads, 0, StreamOf(backend)>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

}  // namespace corolla
