#include "parallel/cuda/nvl_ep_exchange.h"

#include <cuda_runtime.h>
#include <nccl_device.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "parallel/cuda/nccl_handle.h"
#include "parallel/cuda/symmetric.h"

namespace corolla {
namespace {

using cuda::bf16_t;

constexpr int kMaxRanks = 8;     // a route mask bit per rank; per-rank counters in registers
constexpr int kMaxTopK = 32;     // one lane per slot
constexpr int kBlocks = 64;      // of every launch, on every rank: LSA barrier b pairs blocks b
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Where things are in each rank's window (bytes; all 16-byte aligned).
struct WindowLayout {
  size_t dispatch_off;  // [ranks senders][capacity][row_bytes]
  size_t combine_off;   // [ranks experts' ranks][capacity][hidden] bf16
  size_t ranges_off;    // [ranks senders][kBlocks] int4 {first row, rows, total rows, 0}
  size_t bytes;
};

struct DispatchParams {
  ncclDevComm dev_comm;
  ncclWindow_t window;
  WindowLayout win;
  const char* x;  // token t at x + t * x_stride_bytes
  int64_t x_stride_bytes;
  const int32_t* ids;
  int64_t ids_stride;
  const float* weights;
  int64_t weights_stride;
  int32_t* map;  // [capacity, ranks] row of token t on rank r, or -1 (local; Combine reads it)
  int tokens, top_k, experts_per_rank, ranks, rank, capacity;
  int64_t x_vecs;  // 16-byte vectors of a token's activations
  int64_t row_bytes, ids_offset, weights_offset;
};

struct CombineParams {
  ncclDevComm dev_comm;
  ncclWindow_t window;
  WindowLayout win;
  const bf16_t* expert_out;  // [ranks * capacity, hidden]
  bf16_t* out;               // token t at out + t * out_stride
  int64_t out_stride;
  const int32_t* map;
  int tokens, ranks, rank, capacity;
  int64_t hidden;
};

// This block's contiguous share [first, last) of the rank's tokens.
__device__ __forceinline__ int ShareBegin(int tokens, int block) {
  return static_cast<int>(static_cast<int64_t>(tokens) * block / kBlocks);
}

__device__ __forceinline__ uint32_t RouteMask(const DispatchParams& p, int t) {
  const int num_experts = p.experts_per_rank * p.ranks;
  uint32_t mask = 0;
  for (int k = 0; k < p.top_k; ++k) {
    const int e = p.ids[t * p.ids_stride + k];
    if (e >= 0 && e < num_experts) mask |= 1u << (e / p.experts_per_rank);
  }
  return mask;
}

__device__ __forceinline__ int4* RangeSlot(ncclWindow_t w, const WindowLayout& win, int peer, int sender, int block) {
  return static_cast<int4*>(
      ncclGetLsaPointer(w, win.ranges_off + (static_cast<size_t>(sender) * kBlocks + block) * sizeof(int4), peer));
}

__global__ void __launch_bounds__(kThreads) NvlDispatchKernel(const __grid_constant__ DispatchParams p) {
  __shared__ int s_before[kMaxRanks], s_mine[kMaxRanks], s_total[kMaxRanks];
  const int b = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int t0 = ShareBegin(p.tokens, b), t1 = ShareBegin(p.tokens, b + 1);
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), p.dev_comm, ncclTeamLsa(p.dev_comm), p.dev_comm.lsaBarrier,
                                         static_cast<uint32_t>(b)};
  if (tid < kMaxRanks) s_before[tid] = s_mine[tid] = s_total[tid] = 0;
  __syncthreads();

  // 1. Rows for each destination: of tokens before this share, in it, in all (every block
  //    scans all tokens' ids: no grid-wide step, one launch).
  int before[kMaxRanks] = {}, mine[kMaxRanks] = {}, total[kMaxRanks] = {};
  for (int s = 0; s < p.tokens; s += kThreads) {
    const int t = s + tid;
    const uint32_t mask = t < p.tokens ? RouteMask(p, t) : 0;
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) {
      const bool to_r = (mask >> r) & 1;
      total[r] += __popc(__ballot_sync(0xffffffffu, to_r));
      before[r] += __popc(__ballot_sync(0xffffffffu, to_r && t < t0));
      mine[r] += __popc(__ballot_sync(0xffffffffu, to_r && t >= t0 && t < t1));
    }
  }
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) {
      atomicAdd(&s_before[r], before[r]);
      atomicAdd(&s_mine[r], mine[r]);
      atomicAdd(&s_total[r], total[r]);
    }
  __syncthreads();

  // 2. Rows of this share's tokens on each destination, in token order (one warp).
  if (warp == 0) {
    const unsigned lanes_below = (1u << lane) - 1u;
    int run[kMaxRanks];
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) run[r] = s_before[r];
    for (int s = t0; s < t1; s += 32) {
      const int t = s + lane;
      const uint32_t mask = t < t1 ? RouteMask(p, t) : 0;
#pragma unroll
      for (int r = 0; r < kMaxRanks; ++r) {
        const bool to_r = (mask >> r) & 1;
        const unsigned ballot = __ballot_sync(0xffffffffu, to_r);
        if (t < t1 && r < p.ranks) p.map[t * p.ranks + r] = to_r ? run[r] + __popc(ballot & lanes_below) : -1;
        run[r] += __popc(ballot);
      }
    }
  }
  __syncthreads();  // map of the share visible to the block

  // 3. Pack: one warp per token; its activations read once and stored into each destination.
  for (int t = t0 + warp; t < t1; t += kWarps) {
    char* dst[kMaxRanks];
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) {
      const int j = r < p.ranks ? p.map[t * p.ranks + r] : -1;
      dst[r] = j < 0 ? nullptr
                     : static_cast<char*>(ncclGetLsaPointer(
                           p.window, p.win.dispatch_off + (static_cast<size_t>(p.rank) * p.capacity + j) * p.row_bytes, r));
    }
    const uint4* src = reinterpret_cast<const uint4*>(p.x + t * p.x_stride_bytes);
    for (int64_t i = lane; i < p.x_vecs; i += 32) {
      const uint4 v = src[i];
#pragma unroll
      for (int r = 0; r < kMaxRanks; ++r)
        if (dst[r] != nullptr) reinterpret_cast<uint4*>(dst[r])[i] = v;
    }
    if (lane < p.top_k) {
      const int e = p.ids[t * p.ids_stride + lane];
      const float w = p.weights[t * p.weights_stride + lane];
#pragma unroll
      for (int r = 0; r < kMaxRanks; ++r) {
        if (dst[r] == nullptr) continue;
        const int local = e - r * p.experts_per_rank;
        reinterpret_cast<int32_t*>(dst[r] + p.ids_offset)[lane] = local >= 0 && local < p.experts_per_rank ? local : -1;
        reinterpret_cast<float*>(dst[r] + p.weights_offset)[lane] = w;
      }
    }
  }
  // 4. This share's rows on each destination, for its padding and for Combine.
  if (tid < p.ranks) *RangeSlot(p.window, p.win, tid, p.rank, b) = make_int4(s_before[tid], s_mine[tid], s_total[tid], 0);
  bar.sync(ncclCoopCta(), ::cuda::memory_order_acq_rel);

  // 5. Rows [total, capacity) of each sender's block carry no token: ids -1 (rows = b mod kBlocks).
  char* local = static_cast<char*>(ncclGetLocalPointer(p.window, p.win.dispatch_off));
  for (int s = 0; s < p.ranks; ++s) {
    const int filled = __ldcg(static_cast<const int4*>(ncclGetLocalPointer(
                                  p.window, p.win.ranges_off + (static_cast<size_t>(s) * kBlocks + b) * sizeof(int4))))
                           .z;
    const int first = filled + ((b - filled) % kBlocks + kBlocks) % kBlocks;
    const int num_rows = first < p.capacity ? (p.capacity - 1 - first) / kBlocks + 1 : 0;
    for (int i = tid; i < num_rows * p.top_k; i += kThreads) {
      char* row = local + (static_cast<size_t>(s) * p.capacity + first + (i / p.top_k) * kBlocks) * p.row_bytes;
      reinterpret_cast<int32_t*>(row + p.ids_offset)[i % p.top_k] = -1;
      reinterpret_cast<float*>(row + p.weights_offset)[i % p.top_k] = 0.0f;
    }
  }
}

__global__ void __launch_bounds__(kThreads) NvlCombineKernel(const __grid_constant__ CombineParams p) {
  const int b = blockIdx.x, tid = threadIdx.x;
  const int64_t vecs = p.hidden / 8;
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), p.dev_comm, ncclTeamLsa(p.dev_comm), p.dev_comm.lsaBarrier,
                                         static_cast<uint32_t>(b)};
  // 1. Send back the outputs of the rows sender s's block b sent here.
  for (int s = 0; s < p.ranks; ++s) {
    const int4 range = __ldcg(static_cast<const int4*>(
        ncclGetLocalPointer(p.window, p.win.ranges_off + (static_cast<size_t>(s) * kBlocks + b) * sizeof(int4))));
    if (range.y == 0) continue;
    const size_t row0 = static_cast<size_t>(s) * p.capacity + range.x;
    const uint4* src = reinterpret_cast<const uint4*>(p.expert_out + row0 * p.hidden);
    uint4* dst = static_cast<uint4*>(ncclGetLsaPointer(
        p.window, p.win.combine_off + (static_cast<size_t>(p.rank) * p.capacity + range.x) * p.hidden * sizeof(bf16_t), s));
    for (int64_t i = tid; i < range.y * vecs; i += kThreads) dst[i] = src[i];
  }
  bar.sync(ncclCoopCta(), ::cuda::memory_order_acq_rel);
  // 2. Each token of this share: its partials in rank order, f32, one rounding.
  const int t0 = ShareBegin(p.tokens, b), t1 = ShareBegin(p.tokens, b + 1);
  const bf16_t* back = static_cast<const bf16_t*>(ncclGetLocalPointer(p.window, p.win.combine_off));
  for (int64_t i = tid; i < (t1 - t0) * vecs; i += kThreads) {
    const int t = t0 + static_cast<int>(i / vecs);
    const int64_t c = i % vecs;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int r = 0; r < p.ranks; ++r) {
      const int j = p.map[t * p.ranks + r];
      if (j < 0) continue;
      const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(back + (static_cast<size_t>(r) * p.capacity + j) * p.hidden) + c);
      float v[8];
      cuda::Unpack8(reinterpret_cast<const cuda::Bf16x8&>(raw), v);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += v[k];
    }
    reinterpret_cast<cuda::Bf16x8*>(p.out + t * p.out_stride)[c] = cuda::Pack8(acc);
  }
}

class NvlEpExchange final : public EpExchange {
 public:
  NvlEpExchange(const NcclHandle& nccl, const NvlEpExchangeConfig& config, std::unique_ptr<SymmetricMemory> mem,
                const WindowLayout& win, int32_t* map)
      : nccl_(nccl), config_(config), layout_{config.hidden, config.top_k, DType::kBF16}, mem_(std::move(mem)),
        win_(win), map_(map) {}
  ~NvlEpExchange() override {
    mem_.reset();  // waits for the device first
    cudaFree(map_);
  }

  ExpertInputs Dispatch(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights) override {
    const int64_t tokens = x.dim(0), ranks = nccl_.size, capacity = config_.exchange.capacity;
    COROLLA_CHECK(x.device == Device::kCuda && x.dtype == DType::kBF16 && x.rank() == 2 && x.strides[1] == 1 &&
                  x.dim(1) == config_.hidden && (tokens <= 1 || x.strides[0] % 8 == 0) &&
                  reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && topk_ids.dtype == DType::kI32 &&
                  topk_ids.rank() == 2 && topk_ids.strides[1] == 1 && topk_ids.dim(0) == tokens &&
                  topk_ids.dim(1) == config_.top_k && topk_weights.dtype == DType::kF32 && topk_weights.rank() == 2 &&
                  topk_weights.strides[1] == 1 && topk_weights.dim(0) == tokens && topk_weights.dim(1) == config_.top_k)
        << "nvl ep dispatch: x " << x.ToString() << " ids " << topk_ids.ToString() << " weights "
        << topk_weights.ToString() << " (bf16 [T, " << config_.hidden << "], K " << config_.top_k << ")";
    COROLLA_CHECK(tokens <= capacity)
        << "ep dispatch: " << tokens << " tokens exceed the exchange's capacity of " << capacity << " per rank";
    tokens_ = tokens;
    DispatchParams p{mem_->dev_comm(), mem_->window(), win_, static_cast<const char*>(x.data),
                     x.strides[0] * 2, topk_ids.ptr<int32_t>(), topk_ids.strides[0], topk_weights.ptr<float>(),
                     topk_weights.strides[0], map_, static_cast<int>(tokens), static_cast<int>(config_.top_k),
                     config_.exchange.num_experts / static_cast<int>(ranks), static_cast<int>(ranks), nccl_.rank,
                     static_cast<int>(capacity), config_.hidden * 2 / 16, layout_.row_bytes(), layout_.ids_offset(),
                     layout_.weights_offset()};
    NvlDispatchKernel<<<kBlocks, kThreads, 0, nccl_.stream>>>(p);
    COROLLA_CUDA_CHECK_LAUNCH();
    // Views of this rank's received rows, in its window (valid until the next Dispatch).
    const int64_t rows = ranks * capacity;
    char* base = static_cast<char*>(mem_->local()) + win_.dispatch_off;
    auto field = [&](int64_t offset, DType dtype, int64_t cols) {
      TensorView v(base + offset, dtype, {rows, cols}, Device::kCuda, x.device_idx);
      v.strides[0] = layout_.row_bytes() / DTypeSize(dtype);
      return v;
    };
    return {field(0, DType::kBF16, config_.hidden), field(layout_.ids_offset(), DType::kI32, config_.top_k),
            field(layout_.weights_offset(), DType::kF32, config_.top_k)};
  }

  void Combine(const TensorView& expert_out, const TensorView& out) override {
    const int64_t rows = int64_t{nccl_.size} * config_.exchange.capacity;
    COROLLA_CHECK(expert_out.device == Device::kCuda && expert_out.dtype == DType::kBF16 && expert_out.rank() == 2 &&
                  expert_out.dim(0) == rows && expert_out.dim(1) == config_.hidden && expert_out.is_contiguous() &&
                  reinterpret_cast<uintptr_t>(expert_out.data) % 16 == 0 && out.device == Device::kCuda &&
                  out.dtype == DType::kBF16 && out.rank() == 2 && out.dim(0) == tokens_ &&
                  out.dim(1) == config_.hidden && cuda::Vectorisable(out, config_.hidden))
        << "nvl ep combine of " << expert_out.ToString() << " into " << out.ToString() << " after a dispatch of "
        << tokens_ << " tokens (" << rows << " rows received)";
    CombineParams p{mem_->dev_comm(), mem_->window(), win_, expert_out.ptr<bf16_t>(), out.ptr<bf16_t>(),
                    out.strides[0], map_, static_cast<int>(tokens_), nccl_.size, nccl_.rank,
                    config_.exchange.capacity, config_.hidden};
    NvlCombineKernel<<<kBlocks, kThreads, 0, nccl_.stream>>>(p);
    COROLLA_CUDA_CHECK_LAUNCH();
  }

 private:
  const NcclHandle nccl_;
  const NvlEpExchangeConfig config_;
  const EpRowLayout layout_;
  std::unique_ptr<SymmetricMemory> mem_;
  const WindowLayout win_;
  int32_t* map_;  // [capacity, ranks] i32, device
  int64_t tokens_ = 0;
};

}  // namespace

Result<std::unique_ptr<EpExchange>> MakeNvlEpExchange(Backend& backend, Communicator& comm,
                                                      const NvlEpExchangeConfig& config) {
  (void)backend;  // the kernels run on the communicator's stream, which is the backend's
  const std::optional<NcclHandle> nccl = NcclHandleOf(comm);
  if (!nccl) return Unsupported("the NVLink EP exchange needs an NCCL communicator, not " + comm.name());
  const int ranks = nccl->size, capacity = config.exchange.capacity;
  if (ranks > kMaxRanks) return Unsupported("NVLink EP exchange: " + std::to_string(ranks) + " ranks (at most 8)");
  if (capacity <= 0 || config.hidden <= 0 || config.hidden % 8 != 0 || config.top_k <= 0 ||
      config.top_k > kMaxTopK || config.exchange.num_experts % ranks != 0)
    return InvalidArgument("NVLink EP exchange: capacity " + std::to_string(capacity) + ", hidden " +
                           std::to_string(config.hidden) + ", top-k " + std::to_string(config.top_k) + ", " +
                           std::to_string(config.exchange.num_experts) + " experts over " + std::to_string(ranks) +
                           " ranks (capacity > 0, hidden % 8 == 0, top-k <= 32)");
  const EpRowLayout layout{config.hidden, config.top_k, DType::kBF16};
  WindowLayout win;
  win.dispatch_off = 0;
  win.combine_off = win.dispatch_off + static_cast<size_t>(ranks) * capacity * layout.row_bytes();
  win.ranges_off = win.combine_off + static_cast<size_t>(ranks) * capacity * config.hidden * sizeof(bf16_t);
  win.bytes = win.ranges_off + static_cast<size_t>(ranks) * kBlocks * sizeof(int4);
  ASSIGN_OR_RETURN(std::unique_ptr<SymmetricMemory> mem, SymmetricMemory::Create(nccl->comm, win.bytes, kBlocks));
  int32_t* map = nullptr;
  COROLLA_CUDA_CHECK(cudaMalloc(&map, static_cast<size_t>(capacity) * ranks * sizeof(int32_t)));
  return std::unique_ptr<EpExchange>(new NvlEpExchange(*nccl, config, std::move(mem), win, map));
}

}  // namespace corolla
