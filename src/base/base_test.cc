#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <vector>

#include "base/histogram.h"
#include "base/numeric.h"
#include "base/status.h"
#include "base/thread_pool.h"

namespace corolla {
namespace {

TEST(Numeric, Bf16RoundsToNearestEven) {
  EXPECT_EQ(ToBf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(ToFloat(ToBf16(1.0f)), 1.0f);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(ToFloat(ToBf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(ToFloat(ToBf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(ToFloat(ToBf16(NAN))));
  EXPECT_EQ(ToFloat(ToBf16(-2.5f)), -2.5f);
}

TEST(Numeric, Fp16RoundTripsEveryValue) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    fp16 h = fp16::FromBits(static_cast<uint16_t>(b));
    float f = ToFloat(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(ToFp16(f).bits, h.bits) << std::hex << b;
  }
  EXPECT_EQ(ToFloat(fp16::FromBits(0x3c00)), 1.0f);
  EXPECT_EQ(ToFloat(fp16::FromBits(0x0001)), std::ldexp(1.0f, -24));
  EXPECT_EQ(ToFp16(1e6f).bits, 0x7c00);  // overflow to inf
}

TEST(Numeric, Fp8E4m3RoundTripsAndSaturates) {
  for (uint32_t b = 0; b < 256; ++b) {
    fp8e4m3 v = fp8e4m3::FromBits(static_cast<uint8_t>(b));
    float f = ToFloat(v);
    if (std::isnan(f)) {
      EXPECT_EQ(b & 0x7f, 0x7fu);
      continue;
    }
    if (f == 0.0f) continue;  // +0 and -0 both fine
    EXPECT_EQ(ToFp8e4m3(f).bits, v.bits) << b;
  }
  EXPECT_EQ(ToFloat(fp8e4m3::FromBits(0x7e)), 448.0f);
  EXPECT_EQ(ToFloat(fp8e4m3::FromBits(0x01)), std::ldexp(1.0f, -9));
  EXPECT_EQ(ToFloat(ToFp8e4m3(1000.0f)), 448.0f);
  EXPECT_EQ(ToFloat(ToFp8e4m3(-1000.0f)), -448.0f);
  EXPECT_EQ(ToFloat(ToFp8e4m3(1.0625f)), 1.0f);   // halfway between 1 and 1.125: even
  EXPECT_EQ(ToFloat(ToFp8e4m3(1.1875f)), 1.25f);  // halfway between 1.125 and 1.25: even
}

Result<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

// A value goes to the first bucket whose bound is >= it (Prometheus' le), past the last bound
// to +Inf; Add merges histograms of the same buckets (others are a checked error).
TEST(Histogram, BucketsByUpperBoundAndAdds) {
  Histogram h({1, 2, 4});
  for (double v : {0.5, 1.0, 1.5, 2.0, 4.0, 4.5, 100.0}) h.Observe(v);
  EXPECT_EQ(h.counts(), (std::vector<uint64_t>{2, 2, 1, 2}));
  EXPECT_EQ(h.count(), 7u);
  EXPECT_DOUBLE_EQ(h.sum(), 113.5);
  Histogram g(h.bounds());
  g.Observe(3);
  h.Add(g);
  EXPECT_EQ(h.counts(), (std::vector<uint64_t>{2, 2, 2, 2}));
  EXPECT_EQ(h.count(), 8u);
  EXPECT_DOUBLE_EQ(h.sum(), 116.5);
}

TEST(Status, MacrosPropagate) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "invalid argument: odd: 3");
  EXPECT_EQ(s.WithContext("config.json").message(), "config.json: odd: 3");
}

TEST(ThreadPool, CoversEveryIndexOnce) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 3, 4, 5, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << n << " " << i;
  }
  // Nested calls run inline instead of deadlocking.
  std::atomic<int> total{0};
  pool.ParallelFor(8, 1, [&](int64_t b, int64_t e) {
    pool.ParallelFor(10, 1, [&](int64_t b2, int64_t e2) { total += static_cast<int>((e - b) * (e2 - b2)); });
  });
  EXPECT_EQ(total.load(), 80);
}

}  // namespace
}  // namespace corolla
