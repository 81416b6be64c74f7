// Histogram: counts of observed values per bucket (upper bounds, the last bucket unbounded),
// their sum and count, as Prometheus histograms report them. Not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace corolla {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds = {});
  void Observe(double value);  // into the first bucket whose bound is >= value
  // Adds another histogram's observations; its bounds must be these.
  void Add(const Histogram& other);

  const std::vector<double>& bounds() const { return bounds_; }
  const std::vector<uint64_t>& counts() const { return counts_; }  // per bucket, not cumulative
  double sum() const { return sum_; }
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // bounds_.size() + 1: the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

}  // namespace corolla
