#include "parallel/expert_parallel.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "base/logging.h"
#include "kernels/profiling_backend.h"
#include "parallel/cuda/ep_kernels.h"
#ifdef COROLLA_HAVE_CUDA
#include "parallel/cuda/nvl_ep_exchange.h"
#endif

namespace corolla {
namespace {

#ifdef COROLLA_HAVE_CUDA
constexpr bool kHaveCuda = true;
#else
constexpr bool kHaveCuda = false;
#endif

bool OnCpu(const TensorView& t) {
  COROLLA_CHECK(t.device == Device::kCpu || kHaveCuda) << "a CUDA tensor in a build without CUDA";
  return t.device == Device::kCpu;
}

// The backend whose stream the kernels use (`bench --breakdown` wraps it in a ProfilingBackend).
[[maybe_unused]] Backend& DeviceOf(Backend& backend) {
  auto* profiling = dynamic_cast<ProfilingBackend*>(&backend);
  return profiling != nullptr ? profiling->inner() : backend;
}

// First row of each destination rank's block: r * capacity, or after the rows of ranks before r.
std::vector<int64_t> BlockStarts(const int32_t* counts, int ranks, int capacity) {
  std::vector<int64_t> start(ranks, 0);
  for (int r = 1; r < ranks; ++r) start[r] = capacity > 0 ? int64_t{r} * capacity : start[r - 1] + counts[r - 1];
  return start;
}

void CheckPlan(const TensorView& topk_ids, const TensorView& map, const TensorView& counts) {
  COROLLA_CHECK(topk_ids.dtype == DType::kI32 && topk_ids.rank() == 2 && topk_ids.strides[1] == 1 &&
                map.dtype == DType::kI32 && map.rank() == 2 && map.is_contiguous() &&
                map.dim(0) == topk_ids.dim(0) && counts.dtype == DType::kI32 && counts.rank() == 1 &&
                counts.is_contiguous() && counts.dim(0) == map.dim(1) && map.dim(1) <= kMaxEpRanks)
      << "ep plan: ids " << topk_ids.ToString() << " map " << map.ToString() << " counts " << counts.ToString();
}

}  // namespace

void ToLocalExpertIds(Backend& backend, const TensorView& topk_ids, int first_expert) {
  COROLLA_CHECK(topk_ids.dtype == DType::kI32 && topk_ids.rank() == 2 && topk_ids.strides[1] == 1)
      << "topk_ids " << topk_ids.ToString();
  if (first_expert == 0 || topk_ids.numel() == 0) return;
  if (OnCpu(topk_ids)) {
    for (int64_t t = 0; t < topk_ids.dim(0); ++t)
      for (int64_t k = 0; k < topk_ids.dim(1); ++k) topk_ids.ptr<int32_t>()[t * topk_ids.strides[0] + k] -= first_expert;
    return;
  }
#ifdef COROLLA_HAVE_CUDA
  ShiftExpertIdsCuda(DeviceOf(backend), topk_ids, -first_expert);
#endif
}

void PlanEpRoutes(Backend& backend, const TensorView& topk_ids, int experts_per_rank, const TensorView& map,
                  const TensorView& counts) {
  CheckPlan(topk_ids, map, counts);
  if (!OnCpu(topk_ids)) {
#ifdef COROLLA_HAVE_CUDA
    EpPlanCuda(DeviceOf(backend), topk_ids, experts_per_rank, map, counts);
#endif
    return;
  }
  const int64_t tokens = topk_ids.dim(0), k = topk_ids.dim(1);
  const int ranks = static_cast<int>(map.dim(1));
  int32_t* count = counts.ptr<int32_t>();
  std::fill_n(count, ranks, 0);
  for (int64_t t = 0; t < tokens; ++t) {
    int32_t* row = map.ptr<int32_t>() + t * ranks;
    std::fill_n(row, ranks, -1);
    for (int64_t s = 0; s < k; ++s) {
      const int32_t e = topk_ids.ptr<int32_t>()[t * topk_ids.strides[0] + s];
      if (e < 0 || e >= experts_per_rank * ranks) continue;
      const int r = e / experts_per_rank;
      if (row[r] < 0) row[r] = count[r]++;
    }
  }
}

void PackEpRows(Backend& backend, const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                const TensorView& map, const TensorView& counts, int capacity, int experts_per_rank,
                const TensorView& send) {
  CheckPlan(topk_ids, map, counts);
  const int64_t tokens = x.dim(0), k = topk_ids.dim(1);
  const int ranks = static_cast<int>(map.dim(1));
  const EpRowLayout layout{x.dim(1), k, x.dtype};
  COROLLA_CHECK(x.rank() == 2 && x.strides[1] == 1 && topk_ids.dim(0) == tokens && topk_weights.dtype == DType::kF32 &&
                topk_weights.rank() == 2 && topk_weights.strides[1] == 1 && topk_weights.dim(0) == tokens &&
                topk_weights.dim(1) == k && send.dtype == DType::kU8 && send.rank() == 2 && send.is_contiguous() &&
                send.dim(1) == layout.row_bytes() && (capacity == 0 || send.dim(0) == int64_t{ranks} * capacity))
      << "ep pack: x " << x.ToString() << " ids " << topk_ids.ToString() << " weights " << topk_weights.ToString()
      << " into " << send.ToString() << " (capacity " << capacity << ")";
  if (!OnCpu(x)) {
#ifdef COROLLA_HAVE_CUDA
    EpPackCuda(DeviceOf(backend), x, topk_ids, topk_weights, map, counts, capacity, experts_per_rank, layout, send);
#endif
    return;
  }
  const int32_t* count = counts.ptr<int32_t>();
  const std::vector<int64_t> start = BlockStarts(count, ranks, capacity);
  const int64_t row_bytes = layout.row_bytes(), x_bytes = layout.ids_offset();
  char* base = static_cast<char*>(send.data);
  for (int64_t t = 0; t < tokens; ++t) {
    const char* src = static_cast<const char*>(x.data) + t * x.strides[0] * DTypeSize(x.dtype);
    const int32_t* ids = topk_ids.ptr<int32_t>() + t * topk_ids.strides[0];
    const float* w = topk_weights.ptr<float>() + t * topk_weights.strides[0];
    for (int r = 0; r < ranks; ++r) {
      const int32_t j = map.ptr<int32_t>()[t * ranks + r];
      if (j < 0) continue;
      char* dst = base + (start[r] + j) * row_bytes;
      std::memcpy(dst, src, x_bytes);
      int32_t* local = reinterpret_cast<int32_t*>(dst + layout.ids_offset());
      for (int64_t s = 0; s < k; ++s) {
        const int32_t e = ids[s] - r * experts_per_rank;
        local[s] = e >= 0 && e < experts_per_rank ? e : -1;
      }
      std::memcpy(dst + layout.weights_offset(), w, 4 * k);
    }
  }
  if (capacity == 0) return;
  for (int r = 0; r < ranks; ++r)
    for (int64_t j = count[r]; j < capacity; ++j) {
      char* dst = base + (start[r] + j) * row_bytes;
      std::fill_n(reinterpret_cast<int32_t*>(dst + layout.ids_offset()), k, -1);
      std::fill_n(reinterpret_cast<float*>(dst + layout.weights_offset()), k, 0.0f);
    }
}

void CombineEpRows(Backend& backend, const TensorView& back, const TensorView& map, const TensorView& counts,
                   int capacity, const TensorView& out) {
  const int ranks = static_cast<int>(map.dim(1));
  const int64_t tokens = out.dim(0), hidden = out.dim(1);
  COROLLA_CHECK(back.rank() == 2 && back.is_contiguous() && back.dim(1) == hidden && back.dtype == out.dtype &&
                out.rank() == 2 && out.strides[1] == 1 && map.dim(0) == tokens && map.is_contiguous() &&
                counts.dim(0) == ranks && (capacity == 0 || back.dim(0) == int64_t{ranks} * capacity))
      << "ep combine: " << back.ToString() << " into " << out.ToString() << " with map " << map.ToString();
  if (!OnCpu(out)) {
#ifdef COROLLA_HAVE_CUDA
    EpCombineCuda(DeviceOf(backend), back, map, counts, capacity, out);
#endif
    return;
  }
  COROLLA_CHECK(out.dtype == DType::kF32) << "ep combine on the CPU: " << out.ToString();
  const std::vector<int64_t> start = BlockStarts(counts.ptr<int32_t>(), ranks, capacity);
  for (int64_t t = 0; t < tokens; ++t) {
    float* o = out.ptr<float>() + t * out.strides[0];
    std::fill_n(o, hidden, 0.0f);
    for (int r = 0; r < ranks; ++r) {
      const int32_t j = map.ptr<int32_t>()[t * ranks + r];
      if (j < 0) continue;
      const float* b = back.ptr<float>() + (start[r] + j) * hidden;
      for (int64_t i = 0; i < hidden; ++i) o[i] += b[i];
    }
  }
}

namespace {

class AllToAllEpExchange final : public EpExchange {
 public:
  AllToAllEpExchange(Backend& backend, Communicator& comm, const EpExchangeConfig& config)
      : backend_(backend), comm_(comm), config_(config) {}

  ExpertInputs Dispatch(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights) override {
    const int ranks = comm_.size(), capacity = config_.capacity;
    const int64_t tokens = x.dim(0);
    COROLLA_CHECK(x.rank() == 2 && x.dtype == backend_.activation_dtype() && topk_ids.rank() == 2 &&
                  topk_ids.dim(0) == tokens && config_.num_experts % ranks == 0)
        << "ep dispatch of x " << x.ToString() << " ids " << topk_ids.ToString() << " over " << ranks
        << " ranks, " << config_.num_experts << " experts";
    COROLLA_CHECK(capacity == 0 || tokens <= capacity)
        << "ep dispatch: " << tokens << " tokens exceed the exchange's capacity of " << capacity << " per rank";
    const int experts_per_rank = config_.num_experts / ranks;
    const EpRowLayout layout{x.dim(1), topk_ids.dim(1), x.dtype};
    tokens_ = tokens;
    map_ = backend_.Empty(DType::kI32, {tokens, ranks});
    counts_ = backend_.Empty(DType::kI32, {2, ranks});  // [0]: rows this rank sends each peer; [1]: receives
    const TensorView send_counts = counts_.view().Index(0);
    PlanEpRoutes(backend_, topk_ids, experts_per_rank, map_, send_counts);
    int64_t num_send = int64_t{ranks} * capacity, num_recv = num_send;
    if (capacity == 0) {
      comm_.AllToAll(send_counts, counts_.view().Index(1));
      std::vector<int32_t> host(2 * ranks);
      backend_.CopyToHost(counts_, host.data());  // the one host synchronisation of a dispatch
      send_rows_.assign(host.begin(), host.begin() + ranks);
      recv_rows_.assign(host.begin() + ranks, host.end());
      num_send = std::accumulate(send_rows_.begin(), send_rows_.end(), int64_t{0});
      num_recv = std::accumulate(recv_rows_.begin(), recv_rows_.end(), int64_t{0});
    }
    Tensor send = backend_.Empty(DType::kU8, {num_send, layout.row_bytes()});
    PackEpRows(backend_, x, topk_ids, topk_weights, map_, send_counts, capacity, experts_per_rank, send);
    recv_ = backend_.Empty(DType::kU8, {num_recv, layout.row_bytes()});
    if (capacity > 0) {
      comm_.AllToAll(send, recv_);
    } else {
      comm_.AllToAllV(send, send_rows_, recv_, recv_rows_);
    }
    // Views of the received rows: x, ids and weights side by side in each row.
    auto field = [&](int64_t offset, DType dtype, int64_t cols) {
      TensorView v(static_cast<char*>(recv_.view().data) + offset, dtype, {num_recv, cols}, x.device, x.device_idx);
      if (num_recv == 0) v.data = nullptr;
      v.strides[0] = layout.row_bytes() / DTypeSize(dtype);
      return v;
    };
    return {field(0, x.dtype, layout.hidden), field(layout.ids_offset(), DType::kI32, layout.top_k),
            field(layout.weights_offset(), DType::kF32, layout.top_k)};
  }

  void Combine(const TensorView& expert_out, const TensorView& out) override {
    const int ranks = comm_.size(), capacity = config_.capacity;
    COROLLA_CHECK(expert_out.rank() == 2 && expert_out.dim(0) == recv_.dim(0) && expert_out.is_contiguous() &&
                  out.rank() == 2 && out.dim(0) == tokens_ && out.dim(1) == expert_out.dim(1))
        << "ep combine of " << expert_out.ToString() << " into " << out.ToString() << " after a dispatch of "
        << tokens_ << " tokens, " << recv_.dim(0) << " rows received";
    const int64_t num_back = capacity > 0 ? int64_t{ranks} * capacity
                                          : std::accumulate(send_rows_.begin(), send_rows_.end(), int64_t{0});
    Tensor back = backend_.Empty(expert_out.dtype, {num_back, expert_out.dim(1)});
    if (capacity > 0) {
      comm_.AllToAll(expert_out, back);
    } else {
      comm_.AllToAllV(expert_out, recv_rows_, back, send_rows_);
    }
    CombineEpRows(backend_, back, map_, counts_.view().Index(0), capacity, out);
    recv_ = Tensor();  // buffers go back to the allocator, in stream order
    map_ = Tensor();
    counts_ = Tensor();
  }

 private:
  Backend& backend_;
  Communicator& comm_;
  const EpExchangeConfig config_;
  // Between Dispatch and Combine:
  int64_t tokens_ = 0;
  Tensor map_;     // [T, ranks] i32
  Tensor counts_;  // [2, ranks] i32
  Tensor recv_;    // [R, row_bytes] u8
  std::vector<int64_t> send_rows_, recv_rows_;  // capacity 0: rows to and from each rank
};

// A fixed-capacity exchange and a sized one; each forward takes the one its batch selects.
// Dispatch and Combine of one layer go to the same one (the selection changes between
// forwards only).
class SelectableEpExchange final : public EpExchange {
 public:
  SelectableEpExchange(std::unique_ptr<EpExchange> fixed, std::unique_ptr<EpExchange> sized)
      : fixed_(std::move(fixed)), sized_(std::move(sized)) {}
  ExpertInputs Dispatch(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights) override {
    return current().Dispatch(x, topk_ids, topk_weights);
  }
  void Combine(const TensorView& expert_out, const TensorView& out) override { current().Combine(expert_out, out); }
  void SelectFixedCapacity(bool fixed) override { use_fixed_ = fixed; }

 private:
  EpExchange& current() { return use_fixed_ ? *fixed_ : *sized_; }
  std::unique_ptr<EpExchange> fixed_, sized_;
  bool use_fixed_ = false;
};

}  // namespace

bool OverlapSharedExpert() {
  static const bool on = [] {
    const char* v = std::getenv("COROLLA_SHARED_EXPERT_OVERLAP");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

std::unique_ptr<EpExchange> MakeAllToAllEpExchange(Backend& backend, Communicator& comm, const EpExchangeConfig& config) {
  COROLLA_CHECK(comm.size() <= kMaxEpRanks && config.num_experts % comm.size() == 0 && config.capacity >= 0)
      << comm.size() << " EP ranks, " << config.num_experts << " experts, capacity " << config.capacity;
  return std::make_unique<AllToAllEpExchange>(backend, comm, config);
}

RowRange TpRowsOfRank(int64_t tokens, int tp_size, int tp_rank) {
  COROLLA_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size && tokens >= 0);
  const int64_t per_rank = (tokens + tp_size - 1) / tp_size;
  return {std::min(tokens, tp_rank * per_rank), std::min(tokens, (tp_rank + 1) * per_rank)};
}

namespace {

// DP x TP: this TP rank's rows through `inner`, zeros in the other rows of Combine's out (see
// MakeEpExchange). The zeros are a copy from a stride-0 view of one zero row made at load, so
// the exchange stays graph-capturable (no memset API, no host copy in a step).
class TpSlicedEpExchange final : public EpExchange {
 public:
  TpSlicedEpExchange(Backend& backend, std::unique_ptr<EpExchange> inner, int64_t hidden, int tp_size, int tp_rank)
      : backend_(backend), inner_(std::move(inner)), tp_size_(tp_size), tp_rank_(tp_rank) {
    zero_row_ = backend_.Empty(backend_.activation_dtype(), {hidden});
    const std::vector<char> zeros(zero_row_.view().nbytes(), 0);
    backend_.CopyFromHost(zeros.data(), zero_row_);
  }

  ExpertInputs Dispatch(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights) override {
    tokens_ = x.dim(0);
    rows_ = TpRowsOfRank(tokens_, tp_size_, tp_rank_);
    return inner_->Dispatch(x.Slice(rows_.begin, rows_.end), topk_ids.Slice(rows_.begin, rows_.end),
                            topk_weights.Slice(rows_.begin, rows_.end));
  }

  void SelectFixedCapacity(bool fixed) override { inner_->SelectFixedCapacity(fixed); }

  void Combine(const TensorView& expert_out, const TensorView& out) override {
    COROLLA_CHECK(out.rank() == 2 && out.dim(0) == tokens_ && out.dim(1) == zero_row_.view().dim(0))
        << "ep combine into " << out.ToString() << " after a dispatch of " << tokens_ << " tokens";
    inner_->Combine(expert_out, out.Slice(rows_.begin, rows_.end));
    Zero(out.Slice(0, rows_.begin));
    Zero(out.Slice(rows_.end, tokens_));
  }

 private:
  void Zero(const TensorView& rows) {
    if (rows.dim(0) == 0) return;
    TensorView zeros = zero_row_.view();  // [rows, H], every row the same zero row
    zeros.shape = {rows.dim(0), rows.dim(1)};
    zeros.strides = {0, 1, 0, 0};
    backend_.Copy(zeros, rows);
  }

  Backend& backend_;
  std::unique_ptr<EpExchange> inner_;
  int tp_size_, tp_rank_;
  Tensor zero_row_;  // [H] zeros of the activation dtype
  int64_t tokens_ = 0;
  RowRange rows_;
};

Result<std::unique_ptr<EpExchange>> MakeReplicaEpExchange(Backend& backend, Communicator& comm,
                                                          const EpExchangeConfig& config, int64_t hidden, int top_k) {
  if (config.sized_fallback && config.capacity > 0) {
    EpExchangeConfig fixed = config;
    fixed.sized_fallback = false;
    ASSIGN_OR_RETURN(std::unique_ptr<EpExchange> fixed_exchange, MakeReplicaEpExchange(backend, comm, fixed, hidden, top_k));
    return std::unique_ptr<EpExchange>(std::make_unique<SelectableEpExchange>(
        std::move(fixed_exchange), MakeAllToAllEpExchange(backend, comm, {config.num_experts, 0})));
  }
  const char* env = std::getenv("COROLLA_EP_EXCHANGE");
  const std::string kind = env != nullptr && *env != '\0' ? env : "auto";
  if (kind != "auto" && kind != "alltoall" && kind != "nvl")
    return InvalidArgument("COROLLA_EP_EXCHANGE=" + kind + ": expected auto, alltoall or nvl");
  const bool fixed_on_cuda = backend.device() == Device::kCuda && config.capacity > 0;
  if (kind == "nvl" && !fixed_on_cuda)
    return InvalidArgument("COROLLA_EP_EXCHANGE=nvl needs --device cuda and a fixed --ep-capacity > 0");
  if (kind == "nvl" || (kind == "auto" && fixed_on_cuda && config.capacity <= kNvlExchangeMaxCapacity)) {
#ifdef COROLLA_HAVE_CUDA
    Result<std::unique_ptr<EpExchange>> made = MakeNvlEpExchange(backend, comm, {config, hidden, top_k});
    if (made.ok() || kind == "nvl") return made;
    LOG(WARNING) << "the DP-EP exchange stays on the all-to-all: " << made.status().ToString();
#else
    if (kind == "nvl") return InvalidArgument("COROLLA_EP_EXCHANGE=nvl needs a CUDA build");
#endif
  }
  return MakeAllToAllEpExchange(backend, comm, config);
}

}  // namespace

Result<std::unique_ptr<EpExchange>> MakeEpExchange(Backend& backend, Communicator& comm, const EpExchangeConfig& config,
                                                   int64_t hidden, int top_k, int tp_size, int tp_rank) {
  if (tp_size == 1) return MakeReplicaEpExchange(backend, comm, config, hidden, top_k);
  COROLLA_CHECK(tp_size > 1 && tp_rank >= 0 && tp_rank < tp_size) << "tp rank " << tp_rank << " of " << tp_size;
  EpExchangeConfig per_rank = config;
  per_rank.capacity = (config.capacity + tp_size - 1) / tp_size;
  ASSIGN_OR_RETURN(std::unique_ptr<EpExchange> inner, MakeReplicaEpExchange(backend, comm, per_rank, hidden, top_k));
  return std::unique_ptr<EpExchange>(new TpSlicedEpExchange(backend, std::move(inner), hidden, tp_size, tp_rank));
}

}  // namespace corolla
