#include "parallel/cuda/nvl_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "base/numeric.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "parallel/cuda/nccl_communicator.h"
#include "parallel/cuda/nvl_ep_exchange.h"
#include "parallel/expert_parallel.h"

namespace corolla {
namespace {

cudaStream_t StreamOf(Backend& backend) {
  auto* cuda_backend = dynamic_cast<cuda::CudaBackend*>(&backend);
  COROLLA_CHECK(cuda_backend != nullptr) << "NVLink checks need the CUDA backend";
  return cuda_backend->stream();
}

std::vector<float> ToHostFloats(Backend& backend, const Tensor& t) {
  std::vector<float> out(t.numel());
  if (t.dtype() == DType::kBF16) {
    std::vector<bf16> b(t.numel());
    backend.CopyToHost(t, b.data());
    for (size_t i = 0; i < b.size(); ++i) out[i] = ToFloat(b[i]);
  } else {
    backend.CopyToHost(t, out.data());
  }
  backend.Synchronize();
  return out;
}

Tensor FromHostFloats(Backend& backend, DType dtype, const std::vector<float>& host) {
  Tensor t = backend.Empty(dtype, {static_cast<int64_t>(host.size())});
  if (dtype == DType::kBF16) {
    std::vector<bf16> b(host.size());
    for (size_t i = 0; i < host.size(); ++i) b[i] = ToBf16(host[i]);
    backend.CopyFromHost(b.data(), t);
  } else {
    backend.CopyFromHost(host.data(), t);
  }
  return t;
}

// Exact in bf16 whatever the order of the sum: small multiples of 0.5.
float ExactValue(int rank, int64_t i) { return static_cast<float>((i * 7 + rank * 3) % 17 - 8) * 0.5f + rank; }

uint64_t Fnv1a(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

Status CheckRandom(Backend& backend, Communicator& comm, TcpStore& store, AllReduceAlgo algo, DType dtype, int64_t n,
                   bool print) {
  std::mt19937 rng(static_cast<uint32_t>(n * 31 + comm.rank()));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> host(n);
  for (float& v : host) v = u(rng);
  Tensor ours = FromHostFloats(backend, dtype, host), ref = FromHostFloats(backend, dtype, host);
  comm.set_all_reduce_algo(AllReduceAlgo::kNccl);
  comm.AllReduceSum(ref);
  comm.set_all_reduce_algo(algo);
  comm.AllReduceSum(ours);
  const std::vector<float> a = ToHostFloats(backend, ours), b = ToHostFloats(backend, ref);
  double err = 0, scale = 1e-30;
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
    differ += a[i] != b[i];
  }
  // Ours rounds once after an f32 sum in rank order; NCCL's bf16 steps may round in between.
  const double tol = dtype == DType::kBF16 ? 1.0 / 64 : 1e-6;
  ASSIGN_OR_RETURN(std::vector<std::string> hashes, store.AllGather(std::to_string(Fnv1a(a))));
  const bool same = std::all_of(hashes.begin(), hashes.end(), [&](const std::string& h) { return h == hashes[0]; });
  const bool ok = err <= tol * scale && same;
  if (print || !ok)
    std::printf("nvl all-reduce %-7s %-4s n=%-9ld vs nccl: max|diff| %.2e of %.2e, %ld elements differ, ranks %s %s\n",
                AllReduceAlgoName(algo), DTypeName(dtype), static_cast<long>(n), err, scale, static_cast<long>(differ),
                same ? "bit-identical" : "DIFFER", ok ? "ok" : "WRONG");
  comm.set_all_reduce_algo(AllReduceAlgo::kAuto);
  if (!ok) return Internal(std::string("NVLink all-reduce (") + AllReduceAlgoName(algo) + ") wrong on rank " +
                           std::to_string(comm.rank()) + " for " + std::to_string(n) + " elements");
  return Status::Ok();
}

// A graph of three all-reduces (each after a copy from a pristine input), replayed three times
// with an eager all-reduce in between (so replays start at either parity).
Status CheckGraph(Backend& backend, Communicator& comm, AllReduceAlgo algo, bool print) {
  cudaStream_t stream = StreamOf(backend);
  const std::vector<std::pair<DType, int64_t>> shapes = {{DType::kBF16, 1000}, {DType::kF32, 70001}, {DType::kBF16, 300007}};
  std::vector<Tensor> src, x;
  std::vector<std::vector<float>> expect;
  for (const auto& [dtype, n] : shapes) {
    std::vector<float> mine(n), sum(n, 0.0f);
    for (int r = 0; r < comm.size(); ++r)
      for (int64_t i = 0; i < n; ++i) {
        if (r == comm.rank()) mine[i] = ExactValue(r, i);
        sum[i] += ExactValue(r, i);
      }
    src.push_back(FromHostFloats(backend, dtype, mine));
    x.push_back(backend.Empty(dtype, {n}));
    expect.push_back(sum);
  }
  Tensor extra = FromHostFloats(backend, DType::kBF16, std::vector<float>(4096, 1.0f));
  backend.Synchronize();
  comm.set_all_reduce_algo(algo);
  cudaGraph_t graph;
  COROLLA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (size_t j = 0; j < x.size(); ++j) {
    COROLLA_CUDA_CHECK(cudaMemcpyAsync(x[j].view().data, src[j].view().data, x[j].view().nbytes(),
                                       cudaMemcpyDeviceToDevice, stream));
    comm.AllReduceSum(x[j]);
  }
  COROLLA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  COROLLA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  int64_t bad = 0;
  for (int replay = 0; replay < 3; ++replay) {
    for (const Tensor& t : x)  // NaN poison (all-ones bytes)
      COROLLA_CUDA_CHECK(cudaMemsetAsync(t.view().data, 0xff, t.view().nbytes(), stream));
    COROLLA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    comm.AllReduceSum(extra);  // one eager call: the next replay starts at the other parity
    for (size_t j = 0; j < x.size(); ++j) {
      const std::vector<float> got = ToHostFloats(backend, x[j]);
      for (size_t i = 0; i < got.size(); ++i) bad += got[i] != expect[j][i];
    }
  }
  COROLLA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  COROLLA_CUDA_CHECK(cudaGraphDestroy(graph));
  comm.set_all_reduce_algo(AllReduceAlgo::kAuto);
  if (print || bad)
    std::printf("nvl all-reduce %-7s in a CUDA graph, 3 replays: %s\n", AllReduceAlgoName(algo), bad ? "WRONG" : "exact");
  if (bad) return Internal(std::to_string(bad) + " wrong values in graph-replayed all-reduces");
  return Status::Ok();
}

// Median over `samples` of the time per call of `body` (which makes `calls` all-reduces).
double MedianUs(cudaStream_t stream, int samples, int calls, const std::function<void()>& body) {
  cudaEvent_t start, stop;
  COROLLA_CUDA_CHECK(cudaEventCreate(&start));
  COROLLA_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 5; ++i) body();
  std::vector<float> times;
  for (int i = 0; i < samples; ++i) {
    COROLLA_CUDA_CHECK(cudaEventRecord(start, stream));
    body();
    COROLLA_CUDA_CHECK(cudaEventRecord(stop, stream));
    COROLLA_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    COROLLA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1000.0f / calls);
  }
  COROLLA_CUDA_CHECK(cudaEventDestroy(start));
  COROLLA_CUDA_CHECK(cudaEventDestroy(stop));
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

// ---- DP-EP exchange -------------------------------------------------------------------------


// mode 0: K distinct random experts; 1: all on rank 0's experts; 2: drawn with repeats, a
// quarter of the slots -1 (no expert).
EpRouting MakeRouting(int64_t tokens, int experts, int experts_per_rank, int top_k, int mode, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  EpRouting r{std::vector<int32_t>(tokens * top_k), std::vector<float>(tokens * top_k)};
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> all(mode == 1 ? experts_per_rank : experts);
    for (size_t e = 0; e < all.size(); ++e) all[e] = static_cast<int32_t>(e);
    std::shuffle(all.begin(), all.end(), rng);
    for (int k = 0; k < top_k; ++k) {
      int32_t e = all[k % all.size()];
      if (mode == 2) e = rng() % 4 == 0 ? -1 : static_cast<int32_t>(rng() % experts);
      r.ids[t * top_k + k] = e;
      r.weights[t * top_k + k] = u(rng);
    }
  }
  return r;
}


// Dispatch -> device copy of the received rows (the "experts": identity) -> combine, captured
// once and replayed with fresh inputs: out[t] = x[t] times the number of ranks it went to.
Status CheckEpGraph(Backend& backend, Communicator& comm, bool print) {
  const int ranks = comm.size(), experts = 16 * ranks, per_rank = 16, top_k = 8, capacity = 32;
  const int64_t hidden = 2048, tokens = std::vector<int>{32, 0, 17, 5}[comm.rank() % 4];
  ASSIGN_OR_RETURN(std::unique_ptr<EpExchange> ex,
                   MakeNvlEpExchange(backend, comm, {{experts, capacity}, hidden, top_k}));
  cudaStream_t stream = StreamOf(backend);
  Tensor dx = backend.Empty(DType::kBF16, {tokens, hidden}), dids = backend.Empty(DType::kI32, {tokens, top_k}),
         dw = backend.Empty(DType::kF32, {tokens, top_k}), dout = backend.Empty(DType::kBF16, {tokens, hidden});
  Tensor y = backend.Empty(DType::kBF16, {int64_t{ranks} * capacity, hidden});
  backend.Synchronize();
  cudaGraph_t graph;
  COROLLA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ExpertInputs in = ex->Dispatch(dx, dids, dw);
  backend.Copy(in.x, y);
  ex->Combine(y, dout);
  COROLLA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  COROLLA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::mt19937 rng(777 + comm.rank());
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  int64_t bad = 0;
  for (int replay = 0; replay < 4; ++replay) {
    std::vector<bf16> x(tokens * hidden);
    for (auto& v : x) v = ToBf16(u(rng));
    const EpRouting routing = MakeRouting(tokens, experts, per_rank, top_k, replay % 3, rng);
    backend.CopyFromHost(x.data(), dx);
    backend.CopyFromHost(routing.ids.data(), dids);
    backend.CopyFromHost(routing.weights.data(), dw);
    if (tokens > 0) COROLLA_CUDA_CHECK(cudaMemsetAsync(dout.view().data, 0xff, dout.view().nbytes(), stream));  // NaN
    COROLLA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    std::vector<bf16> out(tokens * hidden);
    backend.CopyToHost(dout, out.data());
    backend.Synchronize();
    for (int64_t t = 0; t < tokens; ++t) {
      uint32_t mask = 0;
      for (int k = 0; k < top_k; ++k) {
        const int32_t e = routing.ids[t * top_k + k];
        if (e >= 0 && e < experts) mask |= 1u << (e / per_rank);
      }
      const float n = static_cast<float>(__builtin_popcount(mask));
      for (int64_t h = 0; h < hidden; ++h)
        bad += ToFloat(out[t * hidden + h]) != ToFloat(ToBf16(n * ToFloat(x[t * hidden + h])));
    }
  }
  COROLLA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  COROLLA_CUDA_CHECK(cudaGraphDestroy(graph));
  if (print || bad)
    std::printf("nvl ep exchange in a CUDA graph, rank %d, %ld tokens, 4 replays: %s\n", comm.rank(),
                static_cast<long>(tokens), bad ? "WRONG" : "exact");
  if (bad) return Internal(std::to_string(bad) + " wrong values from the graph-replayed NVLink EP exchange");
  return Status::Ok();
}

}  // namespace

std::vector<bf16> RunExchangeWithHostExperts(Backend& backend, EpExchange& ex, int rank, int experts_per_rank,
                                             int64_t hidden, int top_k, const std::vector<bf16>& x,
                                             const EpRouting& routing) {
  const int64_t tokens = static_cast<int64_t>(x.size()) / hidden;
  Tensor dx = backend.Empty(DType::kBF16, {tokens, hidden}), dids = backend.Empty(DType::kI32, {tokens, top_k}),
         dw = backend.Empty(DType::kF32, {tokens, top_k});
  backend.CopyFromHost(x.data(), dx);
  backend.CopyFromHost(routing.ids.data(), dids);
  backend.CopyFromHost(routing.weights.data(), dw);
  ExpertInputs in = ex.Dispatch(dx, dids, dw);
  const EpRowLayout layout{hidden, top_k, DType::kBF16};
  std::vector<char> rows(in.rows() * layout.row_bytes());
  backend.CopyToHost(TensorView(in.x.data, DType::kU8, {static_cast<int64_t>(rows.size())}, Device::kCuda), rows.data());
  backend.Synchronize();
  std::vector<bf16> expert_out(in.rows() * hidden);
  for (int64_t j = 0; j < in.rows(); ++j) {
    const char* row = rows.data() + j * layout.row_bytes();
    const bf16* rx = reinterpret_cast<const bf16*>(row);
    const int32_t* rid = reinterpret_cast<const int32_t*>(row + layout.ids_offset());
    const float* rw = reinterpret_cast<const float*>(row + layout.weights_offset());
    for (int64_t h = 0; h < hidden; ++h) {
      float acc = 0;
      for (int k = 0; k < top_k; ++k)
        if (rid[k] >= 0 && rid[k] < experts_per_rank)
          acc += rw[k] * static_cast<float>(rank * experts_per_rank + rid[k] + 1) * ToFloat(rx[h]);
      expert_out[j * hidden + h] = ToBf16(acc);
    }
  }
  Tensor dexp = backend.Empty(DType::kBF16, {in.rows(), hidden}), dout = backend.Empty(DType::kBF16, {tokens, hidden});
  backend.CopyFromHost(expert_out.data(), dexp);
  ex.Combine(dexp, dout);
  std::vector<bf16> out(tokens * hidden);
  backend.CopyToHost(dout, out.data());
  backend.Synchronize();
  return out;
}

Status CheckNvlEpExchange(Backend& backend, Communicator& comm, bool print) {
  const int ranks = comm.size(), r = comm.rank(), top_k = 8;
  struct Config {
    int64_t hidden;
    int per_rank, capacity;
  };
  const std::vector<std::vector<int>> rounds = {{37, 5, 90, 1}, {0, 64, 3, 0}, {90, 0, 0, 0}, {0, 0, 0, 0}, {90, 90, 90, 90}};
  for (const Config& c : {Config{128, 8, 90}, Config{7168, 16, 90}}) {
    const int experts = c.per_rank * ranks;
    ASSIGN_OR_RETURN(std::unique_ptr<EpExchange> nvl,
                     MakeNvlEpExchange(backend, comm, {{experts, c.capacity}, c.hidden, top_k}));
    std::unique_ptr<EpExchange> ref = MakeAllToAllEpExchange(backend, comm, {experts, c.capacity});
    for (size_t round = 0; round < rounds.size(); ++round)
      for (int mode = 0; mode < 3; ++mode) {
        const int64_t tokens = rounds[round][r % 4];
        std::mt19937 rng(static_cast<uint32_t>(1000 * round + 10 * mode + r));
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        std::vector<bf16> x(tokens * c.hidden);
        for (auto& v : x) v = ToBf16(u(rng));
        const EpRouting routing = MakeRouting(tokens, experts, c.per_rank, top_k, mode, rng);
        const std::vector<bf16> a = RunExchangeWithHostExperts(backend, *nvl, r, c.per_rank, c.hidden, top_k, x, routing);
        const std::vector<bf16> b = RunExchangeWithHostExperts(backend, *ref, r, c.per_rank, c.hidden, top_k, x, routing);
        int64_t differ = 0;
        double err = 0, scale = 1e-30;
        for (int64_t t = 0; t < tokens; ++t)
          for (int64_t h = 0; h < c.hidden; ++h) {
            double want = 0;
            for (int k = 0; k < top_k; ++k) {
              const int32_t e = routing.ids[t * top_k + k];
              if (e >= 0 && e < experts) want += routing.weights[t * top_k + k] * (e + 1.0) * ToFloat(x[t * c.hidden + h]);
            }
            const float got = ToFloat(a[t * c.hidden + h]);
            differ += got != ToFloat(b[t * c.hidden + h]);
            err = std::max(err, std::fabs(got - want));
            scale = std::max(scale, std::fabs(want));
          }
        const bool ok = differ == 0 && err <= 2e-2 * scale;
        if ((print && mode == 0) || !ok)
          std::printf("nvl ep exchange H %-5ld rank %d round %zu mode %d (%ld tokens): %ld values differ from the NCCL "
                      "exchange, max|diff| %.2e of %.2e vs exact %s\n",
                      static_cast<long>(c.hidden), r, round, mode, static_cast<long>(tokens), static_cast<long>(differ),
                      err, scale, ok ? "ok" : "WRONG");
        if (!ok) return Internal("NVLink EP exchange wrong on rank " + std::to_string(r));
      }
  }
  return CheckEpGraph(backend, comm, print);
}

Status BenchNvlEpExchange(Backend& backend, Communicator& comm, bool print) {
  const int ranks = comm.size(), experts = 128, top_k = 8, per_rank = experts / ranks;
  cudaStream_t stream = StreamOf(backend);
  constexpr int kSamples = 20;
  if (print) {
    std::printf("\nDP-EP exchange, %d ranks, top-%d of %d experts, bf16, fixed capacity = tokens; us per call, median of %d "
                "eager calls\n(nvl GB/s: this rank's bytes to peers over NVLink per dispatch + per combine / their time)\n",
                ranks, top_k, experts, kSamples);
    std::printf("%-7s %-7s | %-10s %-10s | %-10s %-10s | %-8s %s\n", "tokens", "hidden", "nccl_disp", "nccl_comb",
                "nvl_disp", "nvl_comb", "x", "nvl_GBps");
  }
  cudaEvent_t ev[4];
  for (auto& e : ev) COROLLA_CUDA_CHECK(cudaEventCreate(&e));
  for (int64_t hidden : {2048, 4096, 7168})
    for (int tokens : {1, 8, 32, 128, 512, 4096}) {
      std::mt19937 rng(static_cast<uint32_t>(tokens * 7 + comm.rank()));
      const EpRouting routing = MakeRouting(tokens, experts, per_rank, top_k, 0, rng);
      int64_t rows_to_peers = 0;
      for (int t = 0; t < tokens; ++t) {
        uint32_t mask = 0;
        for (int k = 0; k < top_k; ++k) mask |= 1u << (routing.ids[t * top_k + k] / per_rank);
        rows_to_peers += __builtin_popcount(mask & ~(1u << comm.rank()));
      }
      Tensor x_flat = FromHostFloats(backend, DType::kBF16, std::vector<float>(int64_t{tokens} * hidden, 0.0f));
      const TensorView x = x_flat.view().Reshape({tokens, hidden});
      Tensor out = backend.Empty(DType::kBF16, {tokens, hidden});
      Tensor dids = backend.Empty(DType::kI32, {tokens, top_k}), dw = backend.Empty(DType::kF32, {tokens, top_k});
      backend.CopyFromHost(routing.ids.data(), dids);
      backend.CopyFromHost(routing.weights.data(), dw);
      Tensor y = backend.Empty(DType::kBF16, {int64_t{ranks} * tokens, hidden});
      double us[2][2];
      for (int kind = 0; kind < 2; ++kind) {
        std::unique_ptr<EpExchange> ex;
        if (kind == 0) {
          ex = MakeAllToAllEpExchange(backend, comm, {experts, tokens});
        } else {
          ASSIGN_OR_RETURN(ex, MakeNvlEpExchange(backend, comm, {{experts, tokens}, hidden, top_k}));
        }
        std::vector<float> disp, comb;
        for (int i = 0; i < 3 + kSamples; ++i) {
          COROLLA_CUDA_CHECK(cudaEventRecord(ev[0], stream));
          ExpertInputs in = ex->Dispatch(x, dids, dw);
          COROLLA_CUDA_CHECK(cudaEventRecord(ev[1], stream));
          backend.Copy(in.x, y);
          COROLLA_CUDA_CHECK(cudaEventRecord(ev[2], stream));
          ex->Combine(y, out);
          COROLLA_CUDA_CHECK(cudaEventRecord(ev[3], stream));
          COROLLA_CUDA_CHECK(cudaEventSynchronize(ev[3]));
          float d = 0, c = 0;
          COROLLA_CUDA_CHECK(cudaEventElapsedTime(&d, ev[0], ev[1]));
          COROLLA_CUDA_CHECK(cudaEventElapsedTime(&c, ev[2], ev[3]));
          if (i >= 3) {
            disp.push_back(d * 1000.0f);
            comb.push_back(c * 1000.0f);
          }
        }
        for (auto* v : {&disp, &comb}) std::nth_element(v->begin(), v->begin() + v->size() / 2, v->end());
        us[kind][0] = disp[disp.size() / 2];
        us[kind][1] = comb[comb.size() / 2];
      }
      const EpRowLayout layout{hidden, top_k, DType::kBF16};
      const double bytes = rows_to_peers * static_cast<double>(layout.row_bytes() + 2 * hidden);
      if (print)
        std::printf("%-7d %-7ld | %-10.1f %-10.1f | %-10.1f %-10.1f | %-8.2f %.0f\n", tokens, static_cast<long>(hidden),
                    us[0][0], us[0][1], us[1][0], us[1][1], (us[0][0] + us[0][1]) / (us[1][0] + us[1][1]),
                    bytes / ((us[1][0] + us[1][1]) * 1e-6) / 1e9);
    }
  for (auto& e : ev) COROLLA_CUDA_CHECK(cudaEventDestroy(e));
  return Status::Ok();
}

Status CheckNvlAllReduce(Backend& backend, Communicator& comm, TcpStore& store, bool print) {
  if (!HasNvlAllReduce(comm))
    return Unsupported("the NVLink all-reduce is not set up on this communicator (COROLLA_ALLREDUCE=nccl, or see the "
                       "warning above)");
  for (AllReduceAlgo algo : {AllReduceAlgo::kOneShot, AllReduceAlgo::kTwoShot}) {
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{31}, int64_t{1000}, int64_t{4097}, int64_t{65537},
                      (int64_t{1} << 20) + 3, (int64_t{8} << 20) + 5})
      RETURN_IF_ERROR(CheckRandom(backend, comm, store, algo, DType::kBF16, n, print));
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{4099}, (int64_t{1} << 20) + 1, int64_t{4} << 20})
      RETURN_IF_ERROR(CheckRandom(backend, comm, store, algo, DType::kF32, n, print));
    RETURN_IF_ERROR(CheckGraph(backend, comm, algo, print));
  }
  return Status::Ok();
}

Status BenchNvlAllReduce(Backend& backend, Communicator& comm, bool print) {
  cudaStream_t stream = StreamOf(backend);
  const AllReduceAlgo algos[] = {AllReduceAlgo::kNccl, AllReduceAlgo::kOneShot, AllReduceAlgo::kTwoShot};
  constexpr int kCalls = 10, kSamples = 50;
  if (print) {
    std::printf("\nall-reduce latency, bf16, %d ranks, us per call (median of %d samples of %d back-to-back calls;\n"
                "eager launches / one CUDA graph of %d calls); best = fastest graph-replayed, x = NCCL graph / best\n",
                comm.size(), kSamples, kCalls, kCalls);
    std::printf("%-7s %-7s %-9s | %-10s %-10s | %-10s %-10s | %-10s %-10s | %-8s %s\n", "tokens", "hidden", "bytes",
                "nccl", "nccl_g", "oneshot", "oneshot_g", "twoshot", "twoshot_g", "best", "x");
  }
  for (int hidden : {2048, 4096, 7168})
    for (int tokens : {1, 8, 32, 64, 128, 256}) {
      Tensor x_flat = FromHostFloats(backend, DType::kBF16, std::vector<float>(int64_t{tokens} * hidden, 0.0f));
      const TensorView x = x_flat.view().Reshape({tokens, hidden});
      double eager[3], graphed[3];
      for (int a = 0; a < 3; ++a) {
        comm.set_all_reduce_algo(algos[a]);
        eager[a] = MedianUs(stream, kSamples, kCalls, [&] {
          for (int i = 0; i < kCalls; ++i) comm.AllReduceSum(x);
        });
        cudaGraph_t graph;
        COROLLA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < kCalls; ++i) comm.AllReduceSum(x);
        COROLLA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        cudaGraphExec_t exec;
        COROLLA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        graphed[a] = MedianUs(stream, kSamples, kCalls, [&] { COROLLA_CUDA_CHECK(cudaGraphLaunch(exec, stream)); });
        COROLLA_CUDA_CHECK(cudaGraphExecDestroy(exec));
        COROLLA_CUDA_CHECK(cudaGraphDestroy(graph));
      }
      comm.set_all_reduce_algo(AllReduceAlgo::kAuto);
      const int best = static_cast<int>(std::min_element(graphed, graphed + 3) - graphed);
      if (print)
        std::printf("%-7d %-7d %-9ld | %-10.2f %-10.2f | %-10.2f %-10.2f | %-10.2f %-10.2f | %-8s %.2f\n", tokens, hidden,
                    static_cast<long>(2LL * tokens * hidden), eager[0], graphed[0], eager[1], graphed[1], eager[2],
                    graphed[2], AllReduceAlgoName(algos[best]), graphed[0] / graphed[best]);
    }
  return Status::Ok();
}

}  // namespace corolla
