#include "parallel/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "base/logging.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "parallel/cuda/nccl_handle.h"
#include "parallel/cuda/nvl_allreduce.h"

namespace corolla {
namespace {

ncclDataType_t NcclType(DType t) {
  switch (t) {
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kF32: return ncclFloat32;
    case DType::kI32: return ncclInt32;
    default: COROLLA_CHECK(false) << "no NCCL type for " << DTypeName(t);
  }
  return ncclFloat32;
}

int64_t EnvBytes(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoll(v) : fallback;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, int size, int rank, AllReduceAlgo algo,
                   std::unique_ptr<NvlAllReduce> nvl)
      : comm_(comm), stream_(stream), size_(size), rank_(rank), algo_(algo), nvl_(std::move(nvl)) {}
  ~NcclCommunicator() override {
    nvl_.reset();  // its window and device communicator belong to comm_
    ncclCommDestroy(comm_);
  }

  int size() const override { return size_; }
  int rank() const override { return rank_; }
  std::string name() const override { return "nccl"; }

  void AllReduceSum(const TensorView& x) override {
    COROLLA_CHECK(x.device == Device::kCuda && x.is_contiguous()) << "all-reduce of " << x.ToString();
    if (x.numel() == 0) return;
    switch (Choose(x)) {
      case AllReduceAlgo::kOneShot: return nvl_->Run(x, /*two_shot=*/false, stream_);
      case AllReduceAlgo::kTwoShot: return nvl_->Run(x, /*two_shot=*/true, stream_);
      default:
        COROLLA_NCCL_CHECK(ncclAllReduce(x.data, x.data, x.numel(), NcclType(x.dtype), ncclSum, comm_, stream_));
    }
  }
  void set_all_reduce_algo(AllReduceAlgo algo) override { algo_ = algo; }

  // One NCCL group of a send and a receive per peer with rows to move (bytes as ncclUint8);
  // this rank's own block is a device copy. No host synchronisation: graph-capturable.
  void AllToAllV(const TensorView& send, std::span<const int64_t> send_counts, const TensorView& recv,
                 std::span<const int64_t> recv_counts) override {
    COROLLA_CHECK(send.device == Device::kCuda && recv.device == Device::kCuda && send.is_contiguous() &&
                  recv.is_contiguous() && static_cast<int>(send_counts.size()) == size_ &&
                  static_cast<int>(recv_counts.size()) == size_)
        << "all-to-all of " << send.ToString() << " into " << recv.ToString();
    const int64_t num_send = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
    const int64_t num_recv = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
    COROLLA_CHECK(send.dim(0) >= num_send && recv.dim(0) >= num_recv)
        << "all-to-all: " << num_send << " rows to send from " << send.ToString() << ", " << num_recv
        << " to receive into " << recv.ToString();
    auto row_bytes_of = [](const TensorView& x) {  // from the shape: the tensor may have no rows
      int64_t n = DTypeSize(x.dtype);
      for (int i = 1; i < x.rank(); ++i) n *= x.dim(i);
      return n;
    };
    const int64_t row_bytes = row_bytes_of(send);
    COROLLA_CHECK(row_bytes_of(recv) == row_bytes)
        << "all-to-all rows of " << send.ToString() << " and " << recv.ToString() << " differ";
    const char* src = static_cast<const char*>(send.data);
    char* dst = static_cast<char*>(recv.data);
    int64_t send_row = 0, recv_row = 0;
    COROLLA_NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < size_; ++p) {
      const size_t send_bytes = send_counts[p] * row_bytes, recv_bytes = recv_counts[p] * row_bytes;
      if (p == rank_) {
        COROLLA_CHECK_EQ(send_counts[p], recv_counts[p]) << "rows rank " << p << " sends itself";
        if (send_bytes > 0)
          COROLLA_CUDA_CHECK(cudaMemcpyAsync(dst + recv_row * row_bytes, src + send_row * row_bytes, send_bytes,
                                             cudaMemcpyDeviceToDevice, stream_));
      } else {
        if (send_bytes > 0)
          COROLLA_NCCL_CHECK(ncclSend(src + send_row * row_bytes, send_bytes, ncclUint8, p, comm_, stream_));
        if (recv_bytes > 0)
          COROLLA_NCCL_CHECK(ncclRecv(dst + recv_row * row_bytes, recv_bytes, ncclUint8, p, comm_, stream_));
      }
      send_row += send_counts[p];
      recv_row += recv_counts[p];
    }
    COROLLA_NCCL_CHECK(ncclGroupEnd());
  }

  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  bool has_nvl() const { return nvl_ != nullptr; }

 private:
  // The same on every rank: it depends on the size, dtype, alignment and the shared settings.
  AllReduceAlgo Choose(const TensorView& x) const {
    if (nvl_ == nullptr || !NvlAllReduce::Supports(x)) return AllReduceAlgo::kNccl;
    if (algo_ != AllReduceAlgo::kAuto) return algo_;
    const int64_t bytes = x.numel() * DTypeSize(x.dtype);
    if (bytes <= one_shot_max_) return AllReduceAlgo::kOneShot;
    if (bytes <= two_shot_max_) return AllReduceAlgo::kTwoShot;
    return AllReduceAlgo::kNccl;
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int size_, rank_;
  AllReduceAlgo algo_;
  std::unique_ptr<NvlAllReduce> nvl_;  // null: NCCL only
  // kAuto's limits (bytes). On 2 H200 (corolla_parallel_bench, CUDA graphs) one-shot beats NCCL
  // 1.4-2.2x at every decode size measured (4 KB to 3.6 MB) and two-shot never beats one-shot,
  // so one-shot up to 4 MiB and NCCL above; two-shot (for more ranks) only when its limit is
  // raised above one-shot's.
  int64_t one_shot_max_ = EnvBytes("COROLLA_ALLREDUCE_ONESHOT_MAX", int64_t{4} << 20);
  int64_t two_shot_max_ = EnvBytes("COROLLA_ALLREDUCE_TWOSHOT_MAX", int64_t{4} << 20);
};

}  // namespace

Result<std::string> NcclUniqueId() {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
    return Internal(std::string("ncclGetUniqueId: ") + ncclGetErrorString(r));
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(Backend& backend, int device, const std::string& unique_id,
                                                           int size, int rank) {
  auto* cuda_backend = dynamic_cast<cuda::CudaBackend*>(&backend);
  if (cuda_backend == nullptr) return InvalidArgument("NCCL communicators need the CUDA backend, not " + backend.name());
  if (unique_id.size() != sizeof(ncclUniqueId))
    return Internal("bootstrap handed over an NCCL id of " + std::to_string(unique_id.size()) + " bytes");
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  const char* env = std::getenv("COROLLA_ALLREDUCE");
  const std::optional<AllReduceAlgo> algo = ParseAllReduceAlgo(env != nullptr && *env != '\0' ? env : "auto");
  if (!algo) return InvalidArgument(std::string("COROLLA_ALLREDUCE=") + env + ": expected auto, nccl, oneshot or twoshot");
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  COROLLA_CUDA_CHECK(cudaSetDevice(device));
  ncclComm_t comm;
  if (ncclResult_t r = ncclCommInitRank(&comm, size, id, rank); r != ncclSuccess)
    return Internal("ncclCommInitRank (rank " + std::to_string(rank) + " of " + std::to_string(size) +
                    ", device " + std::to_string(device) + "): " + ncclGetErrorString(r));
  // The NVLink kernels' symmetric memory is set up here, collectively, unless NCCL is forced.
  std::unique_ptr<NvlAllReduce> nvl;
  if (*algo != AllReduceAlgo::kNccl) {
    Result<std::unique_ptr<NvlAllReduce>> made = NvlAllReduce::Create(comm, size, rank);
    if (made.ok()) {
      nvl = std::move(*made);
    } else {
      LOG(WARNING) << "all-reduce stays on NCCL: " << made.status().ToString();
    }
  }
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(comm, cuda_backend->stream(), size, rank, *algo, std::move(nvl)));
}

bool HasNvlAllReduce(Communicator& comm) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&comm);
  return nccl != nullptr && nccl->has_nvl();
}

std::optional<NcclHandle> NcclHandleOf(Communicator& comm) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&comm);
  if (nccl == nullptr) return std::nullopt;
  return NcclHandle{nccl->comm(), nccl->stream(), nccl->size(), nccl->rank()};
}

Result<std::vector<double>> BenchNcclAllReduce(Communicator& comm, const std::vector<int64_t>& sizes, int iters,
                                               bool symmetric) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&comm);
  if (nccl == nullptr) return InvalidArgument("not an NCCL communicator");
  const int64_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  const size_t alloc_bytes = (static_cast<size_t>(max_bytes) + 4095) / 4096 * 4096;
  void* buf = nullptr;
  ncclWindow_t win = nullptr;
  if (symmetric) {
    COROLLA_NCCL_CHECK(ncclMemAlloc(&buf, alloc_bytes));
    COROLLA_NCCL_CHECK(ncclCommWindowRegister(nccl->comm(), buf, alloc_bytes, &win, NCCL_WIN_COLL_SYMMETRIC));
  } else {
    COROLLA_CUDA_CHECK(cudaMalloc(&buf, alloc_bytes));
  }
  COROLLA_CUDA_CHECK(cudaMemset(buf, 0, alloc_bytes));  // bf16 zeros stay finite under the sums
  cudaStream_t s = nccl->stream();
  cudaEvent_t start, stop;
  COROLLA_CUDA_CHECK(cudaEventCreate(&start));
  COROLLA_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> us;
  for (int64_t bytes : sizes) {
    const size_t count = static_cast<size_t>(bytes) / 2;
    for (int i = 0; i < 20; ++i) COROLLA_NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclBfloat16, ncclSum, nccl->comm(), s));
    std::vector<float> times;
    for (int i = 0; i < iters; ++i) {
      // Ten back-to-back all-reduces per sample: the launch gap is part of what a decode step pays.
      COROLLA_CUDA_CHECK(cudaEventRecord(start, s));
      for (int j = 0; j < 10; ++j)
        COROLLA_NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclBfloat16, ncclSum, nccl->comm(), s));
      COROLLA_CUDA_CHECK(cudaEventRecord(stop, s));
      COROLLA_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      COROLLA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      times.push_back(ms * 100.0f);  // us per all-reduce
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    us.push_back(times[times.size() / 2]);
  }
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(s));
  COROLLA_CUDA_CHECK(cudaEventDestroy(start));
  COROLLA_CUDA_CHECK(cudaEventDestroy(stop));
  if (symmetric) {
    COROLLA_NCCL_CHECK(ncclCommWindowDeregister(nccl->comm(), win));
    COROLLA_NCCL_CHECK(ncclMemFree(buf));
  } else {
    COROLLA_CUDA_CHECK(cudaFree(buf));
  }
  return us;
}

}  // namespace corolla
