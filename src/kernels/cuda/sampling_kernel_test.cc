// The GPU sampler (sampling.cu) against the CPU's (kernels/cpu/sampling.h): greedy over argmax
// slices, the top-k selection, the nucleus path for rows without a top_k and the full sort, each
// the same tokens as the CPU over awkward rows (ties, NaN, +-inf, rows all -inf or all equal);
// and CudaPerf.Sample, one Sample call's latency on each path. Runs only on a machine with a
// GPU (skips otherwise); scripts/gpu_run.sh runs it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kernels/cpu/sampling.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/test_util.h"

namespace corolla::cuda_test {

// Rows without a top_k sort the whole vocabulary: one radix sort over every row's (row, key)
// bits, so 300 rows sort on 41 bits.
TEST_F(CudaKernelTest, Sample) {
  for (auto [vocab, batch] : {std::pair<int64_t, int64_t>{1000, 16}, {151936, 16}, {1000, 300}}) {
    std::vector<float> logits(batch * vocab);
    std::normal_distribution<float> nd(0.f, 3.f);
    for (auto& l : logits) l = nd(Rng());
    // Awkward rows: ties at the max, -inf and NaN entries, a row all -inf.
    logits[1 * vocab + 5] = logits[1 * vocab + 9] = 100.f;
    for (int64_t i = 0; i < vocab; i += 3) logits[2 * vocab + i] = -INFINITY;
    logits[2 * vocab + 1] = NAN;
    for (int64_t i = 0; i < vocab; ++i) logits[3 * vocab + i] = -INFINITY;
    std::vector<SamplingParams> params(batch);
    std::vector<uint64_t> steps(batch);
    for (int64_t b = 0; b < batch; ++b) {
      SamplingParams& p = params[b];
      p.seed = 1000 + b;
      steps[b] = b * 7;
      switch (b % 8) {
        case 0: p.temperature = 0; break;                                   // greedy
        case 1: p.temperature = 1.f; break;                                 // full distribution
        case 2: p.temperature = 0.7f; p.top_k = 50; break;
        case 3: p.temperature = 1.f; p.top_p = 0.9f; break;
        case 4: p.temperature = 0.6f; p.top_k = 20; p.top_p = 0.95f; break;
        case 5: p.temperature = 1.2f; p.min_p = 0.05f; break;
        case 6: p.temperature = 1.f; p.top_k = 1; break;
        case 7: p.temperature = 0.8f; p.top_p = 0.5f; p.min_p = 0.1f; break;
      }
    }
    std::vector<int32_t> ref(batch), got(batch);
    cpu::SampleBatch(logits.data(), batch, vocab, params.data(), steps.data(), ref.data());
    Tensor g = Upload(gpu(), logits, {batch, vocab}, DType::kF32);
    int mismatches = 0;
    for (int rep = 0; rep < 4; ++rep) {  // several steps: different draws
      for (auto& s : steps) s += 1;
      cpu::SampleBatch(logits.data(), batch, vocab, params.data(), steps.data(), ref.data());
      gpu().Sample(g, params.data(), steps.data(), got.data());
      for (int64_t b = 0; b < batch; ++b) {
        if (got[b] != ref[b]) {
          ++mismatches;
          ADD_FAILURE() << "vocab " << vocab << " row " << b << " (mode " << b % 8 << "): gpu " << got[b] << " cpu " << ref[b];
        }
      }
    }
    Record("Sample.mismatches",
           "B" + std::to_string(batch) + " V" + std::to_string(vocab) + " x4 steps", mismatches, 0);
  }
}

// Greedy rows take the argmax over many CTAs (slices of 2048 logits, then one CTA a row): the
// largest value with ties to the lowest id, across slices too; NaN never wins; a row without a
// finite or +inf logit gives 0. f32 and bf16 logits, vocabularies around a slice's edges.
TEST_F(CudaKernelTest, SampleGreedy) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int64_t vocab : {7, 1000, 2048, 2049, 151936}) {
      for (int64_t batch : {1, 6}) {
        std::vector<float> logits(batch * vocab);
        std::normal_distribution<float> nd(0.f, 3.f);
        for (auto& l : logits) l = nd(Rng());
        auto row = [&](int64_t b) { return logits.data() + b * vocab; };
        if (batch > 1) {
          row(1)[vocab / 3] = row(1)[vocab - 1] = 50.f;  // a tie, in different slices when long
          row(1)[vocab / 2] = NAN;
          for (int64_t i = 0; i < vocab; ++i) row(2)[i] = i % 2 ? -INFINITY : NAN;  // no winner: 0
          row(3)[vocab - 1] = 60.f;                                                 // the last id
          row(4)[vocab / 2] = row(4)[vocab / 4] = INFINITY;
          for (int64_t i = 0; i < vocab; ++i) row(5)[i] = 1.f;  // all tied: id 0
        }
        if (dt == DType::kBF16)
          for (auto& l : logits) l = ToFloat(ToBf16(l));
        std::vector<SamplingParams> params(batch);
        for (auto& p : params) p.temperature = 0.f;  // greedy
        std::vector<uint64_t> steps(batch, 3);
        std::vector<int32_t> ref(batch), got(batch, -7);
        cpu::SampleBatch(logits.data(), batch, vocab, params.data(), steps.data(), ref.data());
        Tensor g = Upload(gpu(), logits, {batch, vocab}, dt);
        gpu().Sample(g, params.data(), steps.data(), got.data());
        const std::string shape = std::string(dt == DType::kF32 ? "f32" : "bf16") + " B" +
                                  std::to_string(batch) + " V" + std::to_string(vocab);
        int mismatches = 0;
        for (int64_t b = 0; b < batch; ++b) {
          mismatches += got[b] != ref[b];
          EXPECT_EQ(got[b], ref[b]) << shape << " row " << b;
        }
        Record("SampleGreedy", shape, mismatches, 0);
      }
    }
  }
}

// Rows that name a top_k take the histogram path (sampling_nucleus.cuh, the plan counting
// entries up to the K-th; fused for a few rows) or, with Tuning().sample_top_k_hist off and every
// sampled row naming a top_k <= 256, the top-k selection (chunks of 2048 sorted in shared memory,
// rounds until one CTA holds the row): each the same tokens as the CPU sampler and as the full
// sort, with ties at the K-th entry, fewer positive weights than K, NaN, +-inf, a greedy row
// beside sampled ones, a K-th entry among weights under e^-32 (the histogram's last bin), and
// vocabularies around the chunks' edges; the histogram path's rows of at most 256 candidates
// sorted by ranks (Tuning().sample_ranked) and by the radix sort.
TEST_F(CudaKernelTest, SampleTopK) {
  const bool select_default = cuda::Tuning().sample_top_k_select;
  const bool ranked_default = cuda::Tuning().sample_ranked;
  const bool hist_default = cuda::Tuning().sample_top_k_hist;
  const bool fused_default = cuda::Tuning().sample_nucleus_fused;
  constexpr int kKinds = 9;
  struct Case {
    DType dtype;
    int64_t vocab, batch;
    int first_kind;  // row b is of kind (first_kind + b) % kKinds
  };
  std::vector<Case> cases;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int64_t vocab : {7, 1000, 2048, 2049, 4500, 151936}) cases.push_back({dt, vocab, 9, 0});
  for (int first : {0, 3, 6}) cases.push_back({DType::kF32, 151936, 3, first});  // fused
  cases.push_back({DType::kBF16, 151936, 1, 8});
  for (const Case& c : cases) {
    for (int max_k : {20, 256}) {  // K: two rounds of the selection over 151936 logits, or four
      const int64_t vocab = c.vocab, batch = c.batch;
      std::vector<float> logits(batch * vocab);
      std::normal_distribution<float> nd(0.f, 3.f);
      for (auto& l : logits) l = nd(Rng());
      const int top_k[kKinds] = {20, 1, 20, max_k == 20 ? 5 : 50, 20, 3, max_k, 20, 20};
      std::vector<SamplingParams> params(batch);
      for (int64_t b = 0; b < batch; ++b) {
        const int kind = static_cast<int>((c.first_kind + b) % kKinds);
        float* r = logits.data() + b * vocab;
        switch (kind) {
          case 2:
            for (int64_t i = 0; i < vocab; ++i) r[i] = std::round(r[i]);  // ties everywhere
            break;
          case 3:
            for (int64_t i = 0; i < vocab; ++i)
              r[i] = i % 97 == 5 ? r[i] : -INFINITY;  // few finite
            r[vocab / 2] = NAN;
            break;
          case 4:
            for (int64_t i = 0; i < vocab; ++i) r[i] = -INFINITY;  // nothing to sample: 0
            break;
          case 5:
            r[vocab / 3] = r[vocab - 1] = INFINITY;
            break;
          case 6:
            r[0] = r[vocab - 1] = 40.f;  // a tie at the max, in different chunks when long
            break;
          case 8:  // three tokens far above the rest: the K-th lies 32+ units below the max
            for (int64_t i = 0; i < std::min<int64_t>(3, vocab); ++i) r[i * vocab / 3] = 60.f + i;
            break;
        }
        SamplingParams& p = params[b];
        p.seed = 77 + b;
        p.temperature = kind == 7 ? 0.f : 0.6f + 0.1f * static_cast<float>(kind);  // 7 greedy
        p.top_k = top_k[kind];
        if (kind % 2 == 0) p.top_p = 0.95f;
        if (kind == 6) p.min_p = 0.02f;
      }
      if (c.dtype == DType::kBF16)
        for (auto& l : logits) l = ToFloat(ToBf16(l));
      Tensor g = Upload(gpu(), logits, {batch, vocab}, c.dtype);
      const std::string shape = std::string(c.dtype == DType::kF32 ? "f32" : "bf16") + " B" +
                                std::to_string(batch) + " V" + std::to_string(vocab) + " K" +
                                std::to_string(max_k) + " first " + std::to_string(c.first_kind);
      int mismatches = 0;
      std::vector<uint64_t> steps(batch);
      for (int rep = 0; rep < 6; ++rep) {  // several draws
        for (int64_t b = 0; b < batch; ++b) steps[b] = 11 * rep + b;
        std::vector<int32_t> ref(batch);
        cpu::SampleBatch(logits.data(), batch, vocab, params.data(), steps.data(), ref.data());
        // 0: the histogram (fused where the step fits), 1: never fused, 2: the selection, 3: sort,
        // 4: 0 without the ranked sort.
        constexpr int kWays = 5;
        std::vector<int32_t> got[kWays];
        for (int way = 0; way < kWays; ++way) {
          cuda::Tuning().sample_top_k_hist = way < 2 || way == 4;
          cuda::Tuning().sample_nucleus_fused = way == 0 || way == 4;
          cuda::Tuning().sample_top_k_select = way != 3;
          cuda::Tuning().sample_ranked = way != 4;
          got[way].assign(batch, -7);
          gpu().Sample(g, params.data(), steps.data(), got[way].data());
        }
        for (int64_t b = 0; b < batch; ++b) {
          const std::string where =
              shape + " row " + std::to_string(b) + " step " + std::to_string(steps[b]);
          for (int way = 0; way < kWays; ++way) {
            mismatches += got[way][b] != ref[b];
            EXPECT_EQ(got[way][b], ref[b]) << where << " way " << way;
          }
        }
      }
      Record("SampleTopK.mismatches", shape + " x6 steps, 5 ways", mismatches, 0);
    }
  }
  cuda::Tuning().sample_top_k_select = select_default;
  cuda::Tuning().sample_ranked = ranked_default;
  cuda::Tuning().sample_top_k_hist = hist_default;
  cuda::Tuning().sample_nucleus_fused = fused_default;
}

// Steps whose sampled rows name no top_k take the nucleus path (sampling_nucleus.cuh: a weight
// histogram, then only the bins that hold the cut and the draw sorted): the same tokens as the
// CPU sampler and as the full sort (Tuning().sample_nucleus off), with top-p, min-p, both, the
// temperature alone, top_p 0, ties, few finite entries, NaN, +-inf, a greedy row beside sampled
// ones, flat rows, rows of 1-4k candidates (the 4096-entry tile), and rows all equal (more entries
// in a bin than one in-block sort takes: the one-CTA sort in global memory); top-k rows among
// them (SampleTopK has more), one with more than a tile of candidates, rows of 256 and 257
// candidates around the ranked sort's limit. Steps of a few rows run fused (one cooperative
// launch: every small vocabulary here, and batch <= 3 at the large ones on an H200); each step
// runs both ways, and fused without the ranked sort of rows of at most 256 candidates
// (Tuning().sample_ranked).
TEST_F(CudaKernelTest, SampleNucleus) {
  const bool nucleus_default = cuda::Tuning().sample_nucleus;
  const bool ranked_default = cuda::Tuning().sample_ranked;
  const bool fused_default = cuda::Tuning().sample_nucleus_fused;
  constexpr int kModes = 15;
  struct Case {
    DType dtype;
    int64_t vocab, batch;
    int first_mode;  // row b takes mode (first_mode + b) % kModes
  };
  std::vector<Case> cases;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int64_t vocab : {7, 1000, 4097, 129280, 151936}) cases.push_back({dt, vocab, kModes, 0});
  // A row all equal (mode 9) holds 256 / 257 candidates: the last the ranked sort takes, the
  // first past it.
  for (int64_t vocab : {256, 257}) cases.push_back({DType::kF32, vocab, kModes, 0});
  cases.push_back({DType::kF32, 151936, 64, 0});
  for (int first : {1, 5, 8, 12}) cases.push_back({DType::kF32, 151936, 3, first});
  cases.push_back({DType::kBF16, 129280, 3, 3});
  cases.push_back({DType::kF32, 129280, 4, 6});
  cases.push_back({DType::kF32, 151936, 1, 2});
  cases.push_back({DType::kBF16, 151936, 1, 9});
  for (const Case& c : cases) {
    const int64_t vocab = c.vocab, batch = c.batch;
    std::vector<float> logits(batch * vocab);
    std::normal_distribution<float> nd(0.f, 3.f);
    for (auto& l : logits) l = nd(Rng());
    auto row = [&](int64_t b) { return logits.data() + b * vocab; };
    std::vector<SamplingParams> params(batch);
    for (int64_t b = 0; b < batch; ++b) {
      SamplingParams& p = params[b];
      p.seed = 31 + b;
      float* r = row(b);
      switch ((c.first_mode + b) % kModes) {
        case 0:
          p.temperature = 0.f;
          break;  // greedy
        case 1:
          p.temperature = 1.f;
          break;  // the temperature alone
        case 2:
          p.temperature = 1.f;
          p.top_p = 0.9f;
          break;
        case 3:
          p.temperature = 0.6f;
          p.top_p = 0.95f;
          for (int64_t i = 0; i < vocab; ++i) r[i] = std::round(r[i]);  // ties everywhere
          break;
        case 4:
          p.temperature = 0.8f;
          p.top_p = 0.5f;
          p.min_p = 0.1f;
          break;
        case 5:
          p.temperature = 1.2f;
          p.min_p = 0.05f;
          break;
        case 6:
          p.temperature = 1.f;
          p.top_p = 0.9f;
          for (int64_t i = 0; i < vocab; ++i) r[i] = i % 97 == 5 ? r[i] : -INFINITY;  // few finite
          r[vocab / 2] = NAN;
          break;
        case 7:
          p.temperature = 0.7f;
          p.top_p = 0.9f;
          for (int64_t i = 0; i < vocab; ++i) r[i] = -INFINITY;  // nothing to sample: 0
          break;
        case 8:
          p.temperature = 1.f;
          p.top_p = 0.95f;
          r[vocab / 3] = r[vocab - 1] = INFINITY;
          break;
        case 9:
          p.temperature = 1.f;
          p.top_p = 0.9f;
          for (int64_t i = 0; i < vocab; ++i) r[i] = 2.5f;  // all equal: one bin holds the row
          break;
        case 10:
          p.temperature = 2.f;
          p.top_p = 0.99f;
          for (int64_t i = 0; i < vocab; ++i) r[i] *= 0.05f;  // flat
          break;
        case 11:
          p.temperature = 0.5f;
          p.top_p = 0.f;
          break;  // only the first token
        case 12:
          p.temperature = 1.f;
          p.top_p = 0.9f;
          for (int64_t i = 0; i < vocab; ++i) r[i] *= 0.1f;  // 1-4k candidates at 152k: a full tile
          break;
        case 13:  // Qwen3's generation_config: a top-k row beside the others
          p.temperature = 0.6f;
          p.top_k = 20;
          p.top_p = 0.95f;
          break;
        case 14:  // flat, more than a tile of candidates (the sort in global memory)
          p.temperature = 1.f;
          p.top_k = 5000;
          p.top_p = 0.9f;
          for (int64_t i = 0; i < vocab; ++i) r[i] *= 0.1f;
          break;
      }
    }
    if (c.dtype == DType::kBF16)
      for (auto& l : logits) l = ToFloat(ToBf16(l));
    Tensor g = Upload(gpu(), logits, {batch, vocab}, c.dtype);
    const std::string shape = std::string(c.dtype == DType::kF32 ? "f32" : "bf16") + " B" +
                              std::to_string(batch) + " V" + std::to_string(vocab);
    int mismatches = 0;
    std::vector<uint64_t> steps(batch);
    for (int rep = 0; rep < 6; ++rep) {  // several draws
      for (int64_t b = 0; b < batch; ++b) steps[b] = 13 * rep + b;
      std::vector<int32_t> ref(batch), got(batch, -7), unfused(batch, -7), radix(batch, -7),
          sorted(batch, -7);
      cpu::SampleBatch(logits.data(), batch, vocab, params.data(), steps.data(), ref.data());
      cuda::Tuning().sample_nucleus = true;
      cuda::Tuning().sample_nucleus_fused = true;
      gpu().Sample(g, params.data(), steps.data(), got.data());
      cuda::Tuning().sample_nucleus_fused = false;
      gpu().Sample(g, params.data(), steps.data(), unfused.data());
      cuda::Tuning().sample_nucleus_fused = true;
      cuda::Tuning().sample_ranked = false;
      gpu().Sample(g, params.data(), steps.data(), radix.data());
      cuda::Tuning().sample_ranked = true;
      cuda::Tuning().sample_nucleus = false;
      gpu().Sample(g, params.data(), steps.data(), sorted.data());
      for (int64_t b = 0; b < batch; ++b) {
        const std::string where = shape + " row " + std::to_string(b) + " (mode " +
                                  std::to_string((c.first_mode + b) % kModes) + ") step " +
                                  std::to_string(steps[b]);
        mismatches += (got[b] != ref[b]) + (unfused[b] != ref[b]) + (radix[b] != ref[b]);
        EXPECT_EQ(got[b], ref[b]) << where;
        EXPECT_EQ(unfused[b], ref[b]) << where << " unfused";
        EXPECT_EQ(radix[b], ref[b]) << where << " radix";
        EXPECT_EQ(got[b], sorted[b]) << where << " sort";
      }
    }
    Record("SampleNucleus.mismatches", shape + " x6 steps, fused, not, radix", mismatches, 0);
  }
  cuda::Tuning().sample_nucleus = nucleus_default;
  cuda::Tuning().sample_ranked = ranked_default;
  cuda::Tuning().sample_nucleus_fused = fused_default;
}

// The sampler's latency a call (upload, kernels, the ids back; wall clock, median of 15) at
// batch 1, 3 and 64 over Qwen3's 151936 logits, with the nucleus path, with it never fused
// (Tuning().sample_nucleus_fused) and with the full sort it replaces (Tuning().sample_nucleus),
// beside greedy; top_k 20 on the histogram path and with the selection; the fused path without
// the ranked sort of rows of at most 256 candidates (Tuning().sample_ranked). Two rows:
// logits of std 0.9 (what Qwen3-30B-A3B's random weights give: flat, ~500 entries a bin) and of
// std 3 (peaked).
TEST(CudaPerf, Sample) {
  if (Gpu() == nullptr) GTEST_SKIP() << "no CUDA device";
  Backend& gpu = *Gpu();
  const int64_t vocab = 151936;
  struct Mode {
    const char* name;
    float temperature, top_p, min_p;
    int top_k;
  };
  const Mode modes[] = {{"greedy", 0.f, 1.f, 0.f, 0},
                        {"t0.6 top_k 20 top_p 0.95", 0.6f, 0.95f, 0.f, 20},
                        {"t0.7 top_p 0.9", 0.7f, 0.9f, 0.f, 0},
                        {"t1", 1.f, 1.f, 0.f, 0},
                        {"t1.2 min_p 0.05", 1.2f, 1.f, 0.05f, 0}};
  for (const float sd : {0.9f, 3.f}) {
    for (const int64_t batch : {1, 3, 64}) {
      std::vector<float> logits(batch * vocab);
      std::normal_distribution<float> nd(0.f, sd);
      for (auto& l : logits) l = nd(Rng());
      Tensor g = Upload(gpu, logits, {batch, vocab}, DType::kF32);
      std::vector<int32_t> got(batch);
      std::vector<uint64_t> steps(batch, 0);
      for (const Mode& m : modes) {
        std::vector<SamplingParams> params(batch);
        for (int64_t b = 0; b < batch; ++b)
          params[b] = {m.temperature, m.top_k, m.top_p, m.min_p, static_cast<uint64_t>(b)};
        // 0: the histogram path (fused where the step fits), 1: never fused, 2: the sort, or for
        // top-k rows the selection, 3: 0 without the ranked sort.
        for (const int way : {0, 1, 2, 3}) {
          if (way > 0 && m.temperature == 0.f) continue;  // the same path
          cuda::Tuning().sample_nucleus = way != 2 || m.top_k > 0;
          cuda::Tuning().sample_nucleus_fused = way == 0 || way == 3;
          cuda::Tuning().sample_top_k_hist = way != 2;
          cuda::Tuning().sample_ranked = way != 3;
          std::vector<double> us;
          for (int rep = 0; rep < 18; ++rep) {
            for (auto& st : steps) ++st;
            const auto t0 = std::chrono::steady_clock::now();
            gpu.Sample(g, params.data(), steps.data(), got.data());
            const auto t1 = std::chrono::steady_clock::now();
            if (rep >= 3) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
          }
          std::sort(us.begin(), us.end());
          std::printf("sample perf: sd %.1f batch %3lld %-26s %-9s %8.1f us\n", sd,
                      static_cast<long long>(batch), m.name,
                      m.temperature == 0.f ? ""
                      : way == 0           ? "nucleus"
                      : way == 1           ? "unfused"
                      : way == 3           ? "radix"
                      : m.top_k > 0        ? "select"
                                           : "sort",
                      us[us.size() / 2]);
        }
      }
    }
  }
  cuda::Tuning() = DefaultTuning();
}

}  // namespace corolla::cuda_test
