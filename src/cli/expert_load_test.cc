// ExpertLoad: rows an expert from topk ids, and the tile counts of its summary.
#include "cli/expert_load.h"

#include <gtest/gtest.h>

#include "kernels/backend.h"

namespace corolla {
namespace {

TEST(ExpertLoad, CountsRowsAndTiles) {
  auto cpu = MakeCpuBackend();
  // Layer 1: expert 0 gets 136 rows (a full 128-row tile and an 8-row tail), expert 2 gets 64
  // (one tail of one 64-row block), expert 3 gets 200 (a full tile and a 72-row tail, two
  // blocks), expert 1 none; one id outside [0, 4) is not counted.
  std::vector<int32_t> ids;
  for (int i = 0; i < 136; ++i) ids.push_back(0);
  for (int i = 0; i < 64; ++i) ids.push_back(2);
  for (int i = 0; i < 200; ++i) ids.push_back(3);
  ids.push_back(7);
  ids.push_back(-1);
  ExpertLoad load;
  Tensor t = Tensor::Empty(DType::kI32, {static_cast<int64_t>(ids.size()) / 2, 2});
  std::copy(ids.begin(), ids.end(), t.ptr<int32_t>());
  load.Record(*cpu, t, 4);
  ASSERT_EQ(load.layers().size(), 1u);
  EXPECT_EQ(load.layers()[0], (std::vector<int64_t>{136, 0, 64, 200}));
  const std::string s = load.Summary();
  // 3 active, 400 rows / 3; tiles 2 + 1 + 2 = 5, full 2, tails 3 (8 and 64 rows at most a
  // block); blocks computed 3 + 1 + 4 = 8 x 64 = 512 rows for 400 routed: 78.1%.
  EXPECT_NE(s.find("3.0 of 4 experts active, 133.3 rows an active expert, the busiest 200.0 (200 at most)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("5.0 a layer, 2.0 full and 3.0 tails (2.0 of at most 64 rows)"), std::string::npos) << s;
  EXPECT_NE(s.find("78.1%"), std::string::npos) << s;
  EXPECT_NE(ExpertLoad().Summary().find("no MoE layer ran"), std::string::npos);
}

}  // namespace
}  // namespace corolla
