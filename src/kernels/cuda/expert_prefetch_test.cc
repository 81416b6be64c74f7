// ForEachExpertPrefetch (expert_prefetch.h), on the host: the dealing of Tuning().moe_prefetch_qkv's
// expert rows to the qkv projection's CTAs.
#include "kernels/cuda/expert_prefetch.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace corolla::cuda {
namespace {

// Every 16-byte unit of every pick's three regions is visited once, by one CTA, in pieces that are
// 16-byte aligned, non-empty, inside their region and in order; CTA shares differ by at most one
// unit. Qwen3-30B-A3B's shapes (H 2048, I 768, top 8) over 132 CTAs, gate rows only, W_down rows
// only, both, fewer units than CTAs, one CTA, a share boundary inside a region.
TEST(ExpertPrefetch, DealsEveryByteOnce) {
  struct Case {
    int64_t gate_rows, down_rows, hidden, inter;
    int top_k, ctas;
  };
  for (const Case c : {Case{256, 0, 2048, 768, 8, 132}, Case{0, 512, 2048, 768, 8, 132},
                       Case{384, 256, 2048, 768, 8, 132}, Case{1, 0, 8, 8, 1, 5}, Case{3, 2, 64, 24, 3, 1},
                       Case{5, 7, 40, 16, 4, 13}}) {
    const int64_t gate = c.gate_rows * c.hidden * 2, down = c.down_rows * c.inter * 2;
    const int64_t per_pick = 2 * gate + down, units = per_pick * c.top_k / 16;
    const std::string shape = "gate " + std::to_string(gate) + " down " + std::to_string(down) + " top " +
                              std::to_string(c.top_k) + " ctas " + std::to_string(c.ctas);
    std::vector<int> seen(static_cast<size_t>(units), 0);
    for (int cta = 0; cta < c.ctas; ++cta) {
      int64_t share = 0, last = -1;
      ForEachExpertPrefetch(gate, down, c.top_k, cta, c.ctas, [&](int slot, int region, int64_t offset, int64_t bytes) {
        ASSERT_TRUE(slot >= 0 && slot < c.top_k) << shape;
        ASSERT_TRUE(region >= 0 && region <= 2) << shape;
        const int64_t size = region == 2 ? down : gate;
        EXPECT_GT(bytes, 0) << shape;
        EXPECT_EQ(offset % 16, 0) << shape;
        EXPECT_EQ(bytes % 16, 0) << shape;
        ASSERT_LE(offset + bytes, size) << shape << " cta " << cta << " region " << region;
        const int64_t at = slot * per_pick + region * gate + offset;  // (down follows the two gate-sized regions)
        EXPECT_GT(at, last) << shape << ": CTA " << cta << "'s pieces out of order";
        last = at;
        for (int64_t u = at / 16; u < (at + bytes) / 16; ++u) ++seen[static_cast<size_t>(u)];
        share += bytes / 16;
      });
      EXPECT_GE(share, units / c.ctas) << shape << " cta " << cta;
      EXPECT_LE(share, units / c.ctas + 1) << shape << " cta " << cta;
    }
    for (int64_t u = 0; u < units; ++u) {
      EXPECT_EQ(seen[static_cast<size_t>(u)], 1) << shape << ": unit " << u;
      if (seen[static_cast<size_t>(u)] != 1) break;
    }
  }
}

}  // namespace
}  // namespace corolla::cuda
