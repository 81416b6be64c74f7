#include "base/histogram.h"

#include <utility>

#include "base/check.h"

namespace corolla {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  size_t b = 0;
  while (b < bounds_.size() && value > bounds_[b]) ++b;
  ++counts_[b];
  sum_ += value;
  ++count_;
}

void Histogram::Add(const Histogram& other) {
  COROLLA_CHECK(other.bounds_ == bounds_) << "histograms with different buckets";
  for (size_t b = 0; b < counts_.size(); ++b) counts_[b] += other.counts_[b];
  sum_ += other.sum_;
  count_ += other.count_;
}

}  // namespace corolla
