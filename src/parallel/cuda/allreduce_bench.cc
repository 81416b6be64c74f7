// corolla_parallel_bench: the multi-GPU layer's own check and timing on one node.
//   corolla_parallel_bench --tp N   (spawns N ranks, one per GPU, like `corolla generate --tp N`)
// Each rank checks AllReduceSum (bf16 and f32, exact sums of rank-dependent values, output
// poisoned first) and the expert-id shift kernel, then times NCCL all-reduce of decode-sized
// bf16 messages on a plain cudaMalloc buffer and on an NCCL symmetric window. Rank 0 prints.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/numeric.h"
#include "parallel/cuda/nccl_communicator.h"
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

Status Run(int tp) {
  ASSIGN_OR_RETURN(ProcessEnv env, ReadProcessEnv());
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, MakeCudaBackend(env.local_rank));
  ASSIGN_OR_RETURN(std::unique_ptr<ParallelContext> par, ParallelContext::Create({tp, 0, 1}, env, *backend));
  const bool print = par->layout().rank == 0;
  Communicator& comm = *par->tp();
  for (int64_t n : {1, 7, 4096, 1000003}) {
    RETURN_IF_ERROR(CheckAllReduce(*backend, comm, DType::kBF16, n, print));
    RETURN_IF_ERROR(CheckAllReduce(*backend, comm, DType::kF32, n, print));
  }
  RETURN_IF_ERROR(CheckShiftIds(*backend, print));

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
  return par->store().Barrier();
}

}  // namespace
}  // namespace corolla

int main(int argc, char** argv) {
  int tp = 2;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--tp") == 0) tp = std::atoi(argv[i + 1]);
  if (std::optional<int> rc = corolla::SpawnLocalRanks(tp, argc, argv)) return *rc;
  corolla::Status s = corolla::Run(tp);
  if (!s.ok()) {
    std::fprintf(stderr, "corolla_parallel_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
