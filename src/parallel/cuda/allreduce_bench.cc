// corolla_parallel_bench: the multi-GPU layer's own check and timing on one node.
//   corolla_parallel_bench --tp N   (spawns N ranks, one per GPU, like `corolla generate --tp N`)
// Each rank checks AllReduceSum (bf16 and f32, exact sums of rank-dependent values, output
// poisoned first), the expert-id shift kernel, AllToAllV / AllToAll (exact, random per-peer
// sizes with zeros, all to one rank, nothing at all) and the DP-EP exchange (dispatch, host
// "experts", combine, against a host reference; uneven token counts, an empty rank; both the
// sized and the fixed-capacity exchange), then times NCCL all-reduce of decode-sized bf16
// messages on a plain cudaMalloc buffer and on an NCCL symmetric window, and the DP-EP
// dispatch + combine of one MoE layer at decode sizes. The NVLink kernels on NCCL's device API
// (nvl_bench.cc): all-reduce one-shot / two-shot exact as above and vs ncclAllReduce on random
// data (1 element to 16 MiB), bit-identical on every rank, CUDA-graph replays; the NVLink EP
// exchange vs the NCCL one (bit-identical outputs) and in a graph; latency tables of both
// against NCCL, and the peer copy bandwidth (nvl_copy.h) as their yardstick. Rank 0 prints.
// --bench-only skips the checks.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/numeric.h"
#include "parallel/cuda/nccl_communicator.h"
#include "parallel/cuda/nvl_bench.h"
#include "parallel/cuda/nvl_copy.h"
#include "parallel/expert_parallel.h"
#include "parallel/launcher.h"
#include "parallel/parallel_context.h"

namespace corolla {
namespace {

// Fills x with rank-dependent values whose sums are exact in bf16; returns the expected sum.
Status CheckAllReduce(Backend& backend, Communicator& comm, DType dtype, int64_t n, bool print) {
  std::vector<float> host(n), expect(n, 0.0f);
  for (int r = 0; r < comm.size(); ++r)
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>((i * 7 + r * 3) % 17 - 8) * 0.5f + r;
      if (r == comm.rank()) host[i] = v;
      expect[i] += v;
    }
  Tensor x = backend.Empty(dtype, {n});
  if (dtype == DType::kBF16) {
    std::vector<bf16> b(n);
    for (int64_t i = 0; i < n; ++i) b[i] = ToBf16(host[i]);
    backend.CopyFromHost(b.data(), x);
  } else {
    backend.CopyFromHost(host.data(), x);
  }
  comm.AllReduceSum(x);
  std::vector<float> got(n);
  if (dtype == DType::kBF16) {
    std::vector<bf16> b(n);
    backend.CopyToHost(x, b.data());
    for (int64_t i = 0; i < n; ++i) got[i] = ToFloat(b[i]);
  } else {
    backend.CopyToHost(x, got.data());
  }
  backend.Synchronize();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += got[i] != expect[i];
  if (print)
    std::printf("all-reduce %-4s n=%-8ld %s\n", DTypeName(dtype), static_cast<long>(n), bad ? "WRONG" : "exact");
  if (bad) return Internal(std::to_string(bad) + " wrong elements in the all-reduce of " + std::to_string(n));
  return Status::Ok();
}

Status CheckShiftIds(Backend& backend, bool print) {
  const int64_t tokens = 37, k = 8;
  std::vector<int32_t> ids(tokens * k), got(tokens * k);
  for (int64_t i = 0; i < tokens * k; ++i) ids[i] = static_cast<int32_t>((i * 13) % 128);
  Tensor t = backend.Empty(DType::kI32, {tokens, k});
  backend.CopyFromHost(ids.data(), t);
  ToLocalExpertIds(backend, t, 64);
  backend.CopyToHost(t, got.data());
  backend.Synchronize();
  for (int64_t i = 0; i < tokens * k; ++i)
    if (got[i] != ids[i] - 64) return Internal("expert id shift wrong at " + std::to_string(i));
  if (print) std::printf("expert id shift          exact\n");
  return Status::Ok();
}

// counts[src][dst]: random with zeros (round 0), all to rank 0 (round 1), none (round 2).
std::vector<std::vector<int64_t>> CountMatrix(int world, int round) {
  std::mt19937 rng(1234 + round);
  std::vector<std::vector<int64_t>> c(world, std::vector<int64_t>(world, 0));
  for (int a = 0; a < world; ++a)
    for (int b = 0; b < world; ++b) {
      if (round == 0) c[a][b] = rng() % 3 == 0 ? 0 : rng() % 700;
      if (round == 1) c[a][b] = b == 0 ? 1 + rng() % 500 : 0;
    }
  return c;
}

float RowValue(int src, int dst, int64_t i, int col) { return static_cast<float>(((src * 131 + dst) * 7919 + i) * 4 + col); }

Status CheckAllToAll(Backend& backend, Communicator& comm, bool print) {
  const int world = comm.size(), r = comm.rank(), cols = 4;
  for (int round = 0; round < 3; ++round) {
    const auto counts = CountMatrix(world, round);
    std::vector<int64_t> send_counts = counts[r], recv_counts(world);
    int64_t num_send = 0, num_recv = 0;
    for (int p = 0; p < world; ++p) {
      recv_counts[p] = counts[p][r];
      num_send += send_counts[p];
      num_recv += recv_counts[p];
    }
    std::vector<float> host;
    for (int p = 0; p < world; ++p)
      for (int64_t i = 0; i < send_counts[p]; ++i)
        for (int c = 0; c < cols; ++c) host.push_back(RowValue(r, p, i, c));
    Tensor send = backend.Empty(DType::kF32, {num_send, cols});
    Tensor recv = backend.Empty(DType::kF32, {num_recv, cols});
    backend.CopyFromHost(host.data(), send);
    std::vector<float> poison(num_recv * cols, NAN), got(num_recv * cols);
    backend.CopyFromHost(poison.data(), recv);
    comm.AllToAllV(send, send_counts, recv, recv_counts);
    backend.CopyToHost(recv, got.data());
    int64_t bad = 0, row = 0;
    for (int p = 0; p < world; ++p)
      for (int64_t i = 0; i < recv_counts[p]; ++i, ++row)
        for (int c = 0; c < cols; ++c) bad += got[row * cols + c] != RowValue(p, r, i, c);
    // Equal blocks of 3 rows per peer.
    std::vector<float> eq;
    for (int p = 0; p < world; ++p)
      for (int i = 0; i < 3; ++i)
        for (int c = 0; c < cols; ++c) eq.push_back(RowValue(r, p, i, c));
    Tensor eq_send = backend.Empty(DType::kF32, {3 * world, cols}), eq_recv = backend.Empty(DType::kF32, {3 * world, cols});
    backend.CopyFromHost(eq.data(), eq_send);
    comm.AllToAll(eq_send, eq_recv);
    backend.CopyToHost(eq_recv, eq.data());
    for (int p = 0; p < world; ++p)
      for (int i = 0; i < 3; ++i)
        for (int c = 0; c < cols; ++c) bad += eq[(3 * p + i) * cols + c] != RowValue(p, r, i, c);
    if (print)
      std::printf("all-to-all round %d (%s) %s\n", round, round == 0 ? "random sizes" : round == 1 ? "all to rank 0" : "empty",
                  bad ? "WRONG" : "exact");
    if (bad) return Internal(std::to_string(bad) + " wrong values in all-to-all round " + std::to_string(round));
  }
  return Status::Ok();
}

// DP-EP exchange on the GPU: the "experts" run on the host (a token scaled by its global
// expert id + 1, weighted), so the check covers plan, pack, both exchanges and combine.
Status CheckEpExchange(Backend& backend, Communicator& comm, int capacity, bool print) {
  const int world = comm.size(), r = comm.rank(), experts = 8 * world, per_rank = 8, hidden = 64, top_k = 4;
  const std::vector<std::vector<int>> rounds = {{37, 5, 90, 1}, {0, 64, 3, 0}, {90, 0, 0, 0}, {0, 0, 0, 0}};
  for (size_t round = 0; round < rounds.size(); ++round) {
    const int64_t tokens = rounds[round][r % 4];
    std::unique_ptr<EpExchange> ex = MakeAllToAllEpExchange(backend, comm, {experts, capacity});
    std::mt19937 rng(static_cast<uint32_t>(100 * round + r));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<bf16> x(tokens * hidden);
    std::vector<int32_t> ids(tokens * top_k);
    std::vector<float> w(tokens * top_k);
    for (auto& v : x) v = ToBf16(u(rng));
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<int32_t> all(experts);
      for (int e = 0; e < experts; ++e) all[e] = e;
      std::shuffle(all.begin(), all.end(), rng);
      for (int k = 0; k < top_k; ++k) {
        ids[t * top_k + k] = all[k];
        w[t * top_k + k] = u(rng);
      }
    }
    const std::vector<bf16> out = RunExchangeWithHostExperts(backend, *ex, r, per_rank, hidden, top_k, x, {ids, w});
    double err = 0, scale = 1e-30;
    for (int64_t t = 0; t < tokens; ++t)
      for (int h = 0; h < hidden; ++h) {
        double ref = 0;
        for (int k = 0; k < top_k; ++k) ref += w[t * top_k + k] * (ids[t * top_k + k] + 1.0) * ToFloat(x[t * hidden + h]);
        err = std::max(err, std::fabs(ToFloat(out[t * hidden + h]) - ref));
        scale = std::max(scale, std::fabs(ref));
      }
    const bool ok = err <= 2e-2 * scale;  // bf16 partials from each rank, summed in f32
    if (print || !ok)
      std::printf("ep exchange rank %d capacity %-3d round %zu (%ld tokens): max|diff| %.2e of %.2e %s\n", r, capacity,
                  round, static_cast<long>(tokens), err, scale, ok ? "ok" : "WRONG");
    if (!ok) return Internal("DP-EP exchange wrong on rank " + std::to_string(r));
  }
  return Status::Ok();
}

// Dispatch + combine of one MoE layer (the experts' work left out: the output is a copy of the
// received tokens), us per layer: host clock over 50 back-to-back layers after a warm-up.
Status BenchEpExchange(Backend& backend, Communicator& comm, bool print) {
  const int experts = 128, hidden = 2048, top_k = 8;
  if (print) {
    std::printf("\nDP-EP dispatch + combine of one MoE layer, %d ranks, E %d, K %d, H %d bf16 (us per layer)\n",
                comm.size(), experts, top_k, hidden);
    std::printf("%-18s %-12s %-12s\n", "tokens per rank", "sized", "capacity");
  }
  for (int tokens : {1, 16, 64, 256}) {
    double us[2] = {0, 0};
    for (int mode = 0; mode < 2; ++mode) {
      std::unique_ptr<EpExchange> ex = MakeAllToAllEpExchange(backend, comm, {experts, mode == 0 ? 0 : tokens});
      std::mt19937 rng(static_cast<uint32_t>(tokens * 7 + comm.rank()));
      std::vector<int32_t> ids(tokens * top_k);
      std::vector<float> w(tokens * top_k, 0.125f);
      for (int t = 0; t < tokens; ++t) {
        std::vector<int32_t> all(experts);
        for (int e = 0; e < experts; ++e) all[e] = e;
        std::shuffle(all.begin(), all.end(), rng);
        std::copy_n(all.begin(), top_k, ids.begin() + t * top_k);
      }
      std::vector<bf16> zeros(static_cast<size_t>(tokens) * hidden, ToBf16(0.0f));
      Tensor x = backend.Empty(DType::kBF16, {tokens, hidden}), out = backend.Empty(DType::kBF16, {tokens, hidden});
      Tensor dids = backend.Empty(DType::kI32, {tokens, top_k}), dw = backend.Empty(DType::kF32, {tokens, top_k});
      backend.CopyFromHost(zeros.data(), x);
      backend.CopyFromHost(ids.data(), dids);
      backend.CopyFromHost(w.data(), dw);
      auto layer = [&] {
        ExpertInputs in = ex->Dispatch(x, dids, dw);
        Tensor y = backend.Empty(DType::kBF16, {in.rows(), hidden});
        if (in.rows() > 0) backend.Copy(in.x, y);
        ex->Combine(y, out);
      };
      for (int i = 0; i < 10; ++i) layer();
      backend.Synchronize();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 50; ++i) layer();
      backend.Synchronize();
      us[mode] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 50;
    }
    if (print) std::printf("%-18d %-12.1f %-12.1f\n", tokens, us[0], us[1]);
  }
  return Status::Ok();
}

Status Run(int tp, bool bench_only) {
  ASSIGN_OR_RETURN(ProcessEnv env, ReadProcessEnv());
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, MakeCudaBackend(env.local_rank));
  ASSIGN_OR_RETURN(std::unique_ptr<ParallelContext> par, ParallelContext::Create({tp, 0, 1}, env, *backend));
  const bool print = par->layout().rank == 0;
  Communicator& comm = *par->tp();
  if (!bench_only) {
    for (AllReduceAlgo algo : {AllReduceAlgo::kNccl, AllReduceAlgo::kOneShot, AllReduceAlgo::kTwoShot}) {
      if (print) std::printf("-- all-reduce algorithm %s\n", AllReduceAlgoName(algo));
      comm.set_all_reduce_algo(algo);
      for (int64_t n : {1, 7, 4096, 1000003}) {
        RETURN_IF_ERROR(CheckAllReduce(*backend, comm, DType::kBF16, n, print));
        RETURN_IF_ERROR(CheckAllReduce(*backend, comm, DType::kF32, n, print));
      }
    }
    comm.set_all_reduce_algo(AllReduceAlgo::kAuto);
    RETURN_IF_ERROR(CheckNvlAllReduce(*backend, comm, par->store(), print));
    RETURN_IF_ERROR(CheckShiftIds(*backend, print));
    RETURN_IF_ERROR(CheckAllToAll(*backend, comm, print));
    RETURN_IF_ERROR(CheckEpExchange(*backend, comm, 0, print));
    RETURN_IF_ERROR(CheckEpExchange(*backend, comm, 90, print));
    RETURN_IF_ERROR(CheckNvlEpExchange(*backend, comm, print));
  }

  // Decode-sized messages: tokens x hidden x 2 bytes.
  struct Size { int tokens, hidden; };
  const std::vector<Size> shapes = {{1, 2048}, {1, 4096}, {1, 7168}, {8, 4096}, {32, 4096},
                                    {64, 4096}, {128, 4096}, {256, 4096}, {256, 7168}};
  std::vector<int64_t> bytes;
  for (const Size& s : shapes) bytes.push_back(2LL * s.tokens * s.hidden);
  ASSIGN_OR_RETURN(std::vector<double> plain, BenchNcclAllReduce(comm, bytes, 50, false));
  Result<std::vector<double>> symm = BenchNcclAllReduce(comm, bytes, 50, true);
  if (print) {
    std::printf("\nall-reduce latency, bf16, %d ranks (median of 50 x 10 back-to-back, us)\n", tp);
    std::printf("%-8s %-7s %-10s %-12s %-14s %s\n", "tokens", "hidden", "bytes", "nccl_us", "nccl_symm_us", "busbw_GBps(nccl)");
    for (size_t i = 0; i < shapes.size(); ++i) {
      const double busbw = 2.0 * (tp - 1) / tp * bytes[i] / (plain[i] * 1e-6) / 1e9;
      std::printf("%-8d %-7d %-10ld %-12.2f %-14s %.1f\n", shapes[i].tokens, shapes[i].hidden,
                  static_cast<long>(bytes[i]), plain[i],
                  symm.ok() ? std::to_string((*symm)[i]).substr(0, 6).c_str() : "n/a", busbw);
    }
    if (!symm.ok()) std::printf("symmetric window: %s\n", symm.status().ToString().c_str());
  }
  // The link's copy rate: the ratio for the GB/s of the NVLink kernels below.
  for (int64_t mib : {16, 256}) {
    ASSIGN_OR_RETURN(PeerCopyRate rate, BenchPeerCopy(comm, mib << 20, 10));
    if (print)
      std::printf("\npeer copy %ld MiB, every rank to the next at once (GB/s one way): push kernel %.1f, pull kernel "
                  "%.1f, nccl send/recv %.1f\n",
                  static_cast<long>(mib), rate.push_gbs, rate.pull_gbs, rate.nccl_gbs);
  }
  RETURN_IF_ERROR(BenchNvlAllReduce(*backend, comm, print));
  RETURN_IF_ERROR(BenchEpExchange(*backend, comm, print));
  RETURN_IF_ERROR(BenchNvlEpExchange(*backend, comm, print));
  return par->store().Barrier();
}

}  // namespace
}  // namespace corolla

int main(int argc, char** argv) {
  int tp = 2;
  bool bench_only = false;  // --bench-only: the timings without the correctness checks first
  for (int i = 1; i < argc; ++i) {
    if (i + 1 < argc && std::strcmp(argv[i], "--tp") == 0) tp = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--bench-only") == 0) bench_only = true;
  }
  if (std::optional<int> rc = corolla::SpawnLocalRanks(tp, argc, argv)) return *rc;
  corolla::Status s = corolla::Run(tp, bench_only);
  if (!s.ok()) {
    std::fprintf(stderr, "corolla_parallel_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
