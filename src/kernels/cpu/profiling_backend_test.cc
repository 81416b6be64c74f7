// ProfilingBackend over the CPU backend (kernels/profiling_backend.h): op labels on a host clock,
// and SkipOps, which `bench decode --skip-op` relies on to time a step without some ops.
#include "kernels/profiling_backend.h"

#include <gtest/gtest.h>

#include <vector>

namespace corolla {
namespace {

Tensor Filled(Backend& b, std::vector<float> values) {
  Tensor t = b.Empty(DType::kF32, {1, static_cast<int64_t>(values.size())});
  b.CopyFromHost(values.data(), t);
  return t;
}

std::vector<float> Read(Backend& b, const Tensor& t) {
  std::vector<float> v(t.numel());
  b.CopyToHost(t, v.data());
  return v;
}

TEST(ProfilingBackend, SkipsOpsByLabelOrFirstWords) {
  ProfilingBackend prof(MakeCpuBackend());
  Tensor x = Filled(prof, {1, 2, 3, 4}), y = Filled(prof, {10, 20, 30, 40});
  Tensor w = Filled(prof, {1, 0, 0, 0, 0, 1, 0, 0}).Reshaped({2, 4});  // the first two rows of I
  Tensor out = Filled(prof, {-1, -1});

  prof.SkipOps({"Add", "Linear 4->2"});
  prof.Add(x, y);
  prof.Linear(x, w, out);
  EXPECT_EQ(Read(prof, x), (std::vector<float>{1, 2, 3, 4}));  // skipped
  EXPECT_EQ(Read(prof, out), (std::vector<float>{-1, -1}));    // skipped by its full label

  prof.SkipOps({"Linear 4->3", "Ad"});  // neither names an op: a word is matched whole
  auto clock = MakeHostOpClock(prof);
  prof.StartRecording(clock.get());
  prof.Add(x, y);
  prof.Linear(x, w, out);
  const std::vector<std::string> labels = prof.StopRecording();
  EXPECT_EQ(Read(prof, x), (std::vector<float>{11, 22, 33, 44}));
  EXPECT_EQ(Read(prof, out), (std::vector<float>{11, 22}));
  ASSERT_EQ(labels.size(), 2u);
  EXPECT_EQ(labels[0], "Add");
  EXPECT_EQ(labels[1], "Linear 4->2 F32");
  EXPECT_EQ(clock->IntervalsMs().size(), 2u);

  prof.SkipOps({"Linear"});  // every Linear
  prof.Linear(y, w, out);
  EXPECT_EQ(Read(prof, out), (std::vector<float>{11, 22}));
}

// An op the inner backend declines (the CPU's DecodeMoeStack) is recorded as declined, so that
// `bench decode --marginal` does not count it as an op of the step.
TEST(ProfilingBackend, LabelsADeclinedOp) {
  ProfilingBackend prof(MakeCpuBackend());
  auto clock = MakeHostOpClock(prof);
  prof.StartRecording(clock.get());
  const bool taken = prof.DecodeMoeStack(MoeDecoderStack{}, AttentionBatch{}, TensorView(), TensorView(), TensorView());
  const std::vector<std::string> labels = prof.StopRecording();
  EXPECT_FALSE(taken);
  ASSERT_EQ(labels.size(), 1u);
  EXPECT_EQ(labels[0], std::string("DecodeMoeStack") + ProfilingBackend::kDeclined);
}

}  // namespace
}  // namespace corolla
