// Sizing the KV cache from a fraction of device memory (the CPU backend reports host RAM).
#include "engine/kv_budget.h"

#include <gtest/gtest.h>

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

  EXPECT_EQ(KvBudgetForUtilization(*backend, c, 1e-9, 2048, 64).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(KvBudgetForUtilization(*backend, c, 0, 2048, 64).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KvBudgetForUtilization(*backend, c, 1.5, 2048, 64).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace corolla
