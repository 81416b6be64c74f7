// Sizing the KV cache from a fraction of device memory (the CPU backend reports host RAM).
#include "engine/kv_budget.h"

#include <gtest/gtest.h>

#include "kernels/profiling_backend.h"
#include "model/model.h"

namespace corolla {
namespace {

TEST(KvBudget, FractionOfMemoryLessWhatIsInUseAndActivations) {
  auto backend = MakeCpuBackend();
  auto model = LoadModel("tests/data/models/qwen3-moe", *backend).value();
  const ModelConfig& c = model->config();
  Backend::MemoryInfo m = backend->QueryMemory().value();
  ASSERT_GT(m.total_bytes, 0);
  ASSERT_GT(m.free_bytes, 0);
  EXPECT_LE(m.free_bytes, m.total_bytes);

  KvBudget b = KvBudgetForUtilization(*backend, c, 1.0, 2048, 64).value();
  EXPECT_GT(b.kv_cache_bytes, 0);
  EXPECT_LE(b.kv_cache_bytes + b.used_bytes + b.activation_bytes, b.total_bytes);
  EXPECT_EQ(b.activation_bytes, EstimateActivationBytes(c, 2048, 64));
  EXPECT_NE(b.ToString().find("GiB"), std::string::npos);
  EXPECT_GT(EstimateActivationBytes(c, 4096, 64), EstimateActivationBytes(c, 2048, 64));
  EXPECT_GT(EstimateActivationBytes(c, 2048, 128), EstimateActivationBytes(c, 2048, 64));
  // A sampled row holds its f32 logits and the GPU sampler's full-sort scratch (24 bytes an
  // entry of the vocabulary, sampling.cu) beside them.
  EXPECT_GE(EstimateActivationBytes(c, 2048, 65) - EstimateActivationBytes(c, 2048, 64),
            (4 + 24) * int64_t{c.vocab_size});

  EXPECT_EQ(KvBudgetForUtilization(*backend, c, 1e-9, 2048, 64).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(KvBudgetForUtilization(*backend, c, 0, 2048, 64).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KvBudgetForUtilization(*backend, c, 1.5, 2048, 64).status().code(), StatusCode::kInvalidArgument);
}

// Where the backend captures graphs, the decode graphs' estimate comes off the KV cache too:
// Qwen3-30B-A3B's 64 sequences and 40960 tokens give the 22 x 9 graphs that session 33 measured.
class GraphBackend : public ProfilingBackend {
 public:
  using ProfilingBackend::ProfilingBackend;
  bool supports_graphs() const override { return true; }
};

TEST(KvBudget, DecodeGraphsComeOffTheCacheWhereTheBackendCapturesThem) {
  auto cpu = MakeCpuBackend();
  auto model = LoadModel("tests/data/models/qwen3-moe", *cpu).value();
  const ModelConfig& c = model->config();
  const int64_t per_graph = int64_t{c.num_layers} * (40 << 10);
  EXPECT_EQ(EstimateDecodeGraphBytes(c, 64, 40960), 22 * 9 * per_graph);
  EXPECT_EQ(EstimateDecodeGraphBytes(c, 256, 40960), 28 * 9 * per_graph);
  EXPECT_EQ(EstimateDecodeGraphBytes(c, 1024, 256), 28 * 1 * per_graph);  // graphs stop at 256 rows
  EXPECT_EQ(EstimateDecodeGraphBytes(c, 3, 300), 3 * 2 * per_graph);

  KvBudget eager = KvBudgetForUtilization(*cpu, c, 1.0, 2048, 64, 40960).value();
  EXPECT_EQ(eager.graph_bytes, 0);
  EXPECT_EQ(eager.ToString().find("graphs"), std::string::npos);
  GraphBackend graphs(MakeCpuBackend());
  KvBudget b = KvBudgetForUtilization(graphs, c, 1.0, 2048, 64, 40960).value();
  EXPECT_EQ(b.graph_bytes, 22 * 9 * per_graph);
  // Both the same fraction of the same total: the graphs come off the KV cache alone.
  EXPECT_EQ(b.kv_cache_bytes + b.used_bytes + b.activation_bytes + b.graph_bytes,
            eager.kv_cache_bytes + eager.used_bytes + eager.activation_bytes);
  EXPECT_NE(b.ToString().find("decode graphs"), std::string::npos);
  // 0: the model's length.
  EXPECT_EQ(KvBudgetForUtilization(graphs, c, 1.0, 2048, 64, 0).value().graph_bytes,
            EstimateDecodeGraphBytes(c, 64, c.max_position_embeddings));
}

}  // namespace
}  // namespace corolla
