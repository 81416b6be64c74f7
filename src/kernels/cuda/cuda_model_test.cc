// Whole-model checks of the CUDA backend: golden logits of the qwen3-dense / qwen3-moe fixtures
// (and against the CPU backend), chunked prefill against one prefill, greedy chats of the demo
// model through the Engine; then a perf section (HBM copy bandwidth, one Qwen3-30B-A3B-shaped
// MoE decode layer with random weights). Needs a GPU; skips otherwise.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/demo_chats.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/test_util.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace corolla::cuda_test {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// max_j |a - b| / max_j |b| over one row.
double RowError(const float* a, const float* b, int64_t n) {
  double err = 0, scale = 0;
  for (int64_t j = 0; j < n; ++j) {
    double d = std::fabs(static_cast<double>(a[j]) - b[j]);
    if (!std::isfinite(a[j])) d = INFINITY;
    err = std::max(err, d);
    scale = std::max(scale, static_cast<double>(std::fabs(b[j])));
  }
  return err / scale;
}

class CudaModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaModelTest, GoldenLogits) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::string name = GetParam();
  auto gpu = MakeCudaBackend(0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  auto cpu = MakeCpuBackend();
  // deepseek-v3-fp8 runs native FP8 GEMMs here (activations quantised per 1 x 128 group; not
  // the default); its CPU reference is then the FP8 twin, and its golden (a float32 forward of
  // the dequantised weights) is ~9e-2 away on that twin too (model/fp8_model_test.cc).
  const bool native_fp8 = name == "deepseek-v3-fp8";
  if (native_fp8) setenv("COROLLA_FP8", "native", 1);
  auto gmodel = LoadModel("tests/data/models/" + name, **gpu);
  ASSERT_TRUE(gmodel.ok()) << gmodel.status().ToString();
  auto cmodel = LoadModel("tests/data/models/" + name, *cpu);
  if (native_fp8) unsetenv("COROLLA_FP8");
  ASSERT_TRUE(cmodel.ok()) << cmodel.status().ToString();
  auto golden = SafetensorsFile::Open("tests/data/golden/" + name + ".safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status().ToString();
  const int64_t vocab = (*gmodel)->config().vocab_size;
  // The hybrid fixture amplifies bf16 activation rounding along the sequence: the CPU backend
  // with every activation rounded to bf16 (states f32) is off its golden by 6e-3, 1.1e-2,
  // 2.3e-2, 6.8e-2, 1.0e-1 at 1, 5, 17, 64, 130 tokens (qwen3-moe stays at 6-7e-3). With its
  // zero-centred norm weights kept in f32 the GPU measured 6.2e-3, 1.1e-2, 6.6e-2, 6.0e-2,
  // 6.6e-2 (in bf16 they alone had moved it to 2.1e-1). So its golden bound is 1e-1, with the
  // recurrent delta rule (pass 0) and with the chunked tensor-core kernel that prefills of >= 64
  // tokens take by default (pass 1). (With bf16 chunk operands the chunked kernel was 3e-3 off
  // its twin per layer, which this fixture carried to 2.3e-1; hi + lo operands brought it back
  // to 6.5e-2, as recurrent: an H200, session 3.)
  // deepseek-v3-fp8 native: cuBLASLt's block-scaled FP8 GEMMs on bf16 activations against the
  // twin's f32 ones land borderline values one e4m3 step apart (12.5%); measured 1.5e-1 from the
  // twin and 2.4e-1 from the golden at the worst of 217 positions (mean 6.9e-2, as the twin's).
  const bool hybrid = name == "qwen3.5-moe-hybrid";
  for (int pass = 0; pass < (hybrid ? 2 : 1); ++pass) {
    const cuda::KernelTuning saved = cuda::Tuning();
    if (hybrid && pass == 0) cuda::Tuning().gated_delta_chunked_min_tokens = INT64_MAX;
    const double golden_tol = hybrid ? 1e-1 : native_fp8 ? 3e-1 : 2e-2;
    const double cpu_tol = native_fp8 ? 2e-1 : golden_tol;
    const std::string label = hybrid ? (pass == 0 ? " (recurrent)" : " (chunked)") : "";
    double worst_golden = 0, worst_cpu = 0;
    for (int k = 0; k < 5; ++k) {
      TensorView ids_view = (*golden)->View(*(*golden)->Find("ids_" + std::to_string(k)));
      std::vector<int32_t> ids(ids_view.ptr<int32_t>(), ids_view.ptr<int32_t>() + ids_view.numel());
      TensorView ref = (*golden)->View(*(*golden)->Find("logits_" + std::to_string(k)));
      auto g = ComputeLogits(**gmodel, **gpu, ids);
      ASSERT_TRUE(g.ok()) << g.status().ToString();
      auto c = ComputeLogits(**cmodel, *cpu, ids);
      ASSERT_TRUE(c.ok());
      ASSERT_EQ(g->shape(), ref.shape);
      double eg = 0, ec = 0;
      for (int64_t p = 0; p < ref.dim(0); ++p) {
        eg = std::max(eg, RowError(g->ptr<float>() + p * vocab, ref.ptr<float>() + p * vocab, vocab));
        ec = std::max(ec, RowError(g->ptr<float>() + p * vocab, c->ptr<float>() + p * vocab, vocab));
      }
      std::printf("%s%s logits_%d (%zu tokens): max error vs golden %.3e, vs cpu %.3e (of max|ref|)\n",
                  name.c_str(), label.c_str(), k, ids.size(), eg, ec);
      Record("Model." + name + label, "logits_" + std::to_string(k) + " vs golden", eg, golden_tol);
      Record("Model." + name + label, "logits_" + std::to_string(k) + " vs cpu", ec, cpu_tol);
      worst_golden = std::max(worst_golden, eg);
      worst_cpu = std::max(worst_cpu, ec);
    }
    EXPECT_LT(worst_golden, golden_tol) << label;
    EXPECT_LT(worst_cpu, cpu_tol) << label;

    // Chunked prefill and decode through the paged cache against one prefill, on the GPU.
    TensorView ids_view = (*golden)->View(*(*golden)->Find("ids_4"));
    std::vector<int32_t> ids(ids_view.ptr<int32_t>(), ids_view.ptr<int32_t>() + ids_view.numel());
    auto full = ComputeLogits(**gmodel, **gpu, ids);
    ASSERT_TRUE(full.ok());
    for (int chunk : {1, 7, 64}) {
      const int bs = 16;
      KvCache kv(**gpu, (*gmodel)->kv_cache_spec(), (static_cast<int>(ids.size()) + bs - 1) / bs + 3, bs,
                 (*gmodel)->state_spec(), 2);
      ModelRunner runner(**gmodel, **gpu, kv);
      Sequence s;
      s.tokens = ids;
      s.num_prompt_tokens = s.num_tokens();
      for (int b = kv.num_blocks() - 1; b >= 0; --b) s.block_table.push_back(b);
      kv.AllocateStateSlot();  // hybrid models: use slot 1, not the first
      s.state_slot = kv.AllocateStateSlot();
      double worst = 0;
      while (s.num_computed_tokens < s.num_tokens()) {
        int n = std::min(chunk, s.num_uncomputed());
        ScheduledChunk c{&s, n};
        Tensor logits = LogitsToHost(**gpu, runner.Execute({&c, 1}, /*all_logits=*/true));
        for (int i = 0; i < n; ++i) {
          int p = s.num_computed_tokens + i;
          worst = std::max(worst, RowError(logits.ptr<float>() + i * vocab, full->ptr<float>() + p * vocab, vocab));
        }
        s.num_computed_tokens += n;
      }
      // Decode-sized steps run other kernels than a prefill (GEMVs for a few rows, the pair MoE
      // path) whose bf16 rounding differs; each is within the golden tolerance of the reference,
      // and so must be the two runs of each other.
      std::printf("%s%s chunk %d vs one prefill: max error %.3e\n", name.c_str(), label.c_str(), chunk, worst);
      Record("Model." + name + label, "chunk " + std::to_string(chunk) + " vs prefill", worst, golden_tol);
      EXPECT_LT(worst, golden_tol) << "chunk " << chunk << label;
    }
    cuda::Tuning() = saved;
  }
}

// deepseek-v3-fp8's golden is a float32 forward of the dequantised weights; the CUDA path
// keeps its projections FP8 (fp8_kernel_test.cc compares that with --fp8 dequant).
INSTANTIATE_TEST_SUITE_P(Fixtures, CudaModelTest,
                         ::testing::Values("qwen3-dense", "qwen3-moe", "qwen3.5-moe-hybrid", "deepseek-v3",
                                           "deepseek-v3-fp8"));

// Greedy ids of each request with, at every step, the margin between the chosen token's
// logprob and the runner-up's (num_logprobs 2 on every request: host sampling).
struct TracedRun {
  std::vector<int32_t> ids;
  std::vector<float> margin;
};
std::vector<TracedRun> RunTraced(Engine& engine, std::vector<GenerationRequest> requests) {
  std::vector<int64_t> ids;
  for (GenerationRequest& r : requests) {
    r.num_logprobs = 2;
    ids.push_back(engine.AddRequest(r).value());
  }
  std::map<int64_t, TracedRun> by_id;
  while (engine.HasUnfinished())
    for (const StepOutput& o : engine.Step()) {
      TracedRun& t = by_id[o.seq_id];
      t.ids.push_back(o.token);
      t.margin.push_back(o.top_logprobs.size() >= 2 ? o.top_logprobs[0].logprob - o.top_logprobs[1].logprob
                                                    : INFINITY);
    }
  std::vector<TracedRun> out;
  for (int64_t id : ids) out.push_back(by_id[id]);
  return out;
}

// The hybrid's per-sequence states on the GPU survive batching, chunked prefill, preemption and
// slot reuse under the engine: every request decodes greedily as it does alone, or, where a
// recomputed prefix (prefill kernels, chunked Gated DeltaNet) and the decode path round
// differently, the two part at a near-tie: the alone run's top-2 margin there is below
// kNearTie. (This fixture's tiny random weights make near-ties common: its CUDA graphs agree
// with the CPU on 4 of 13 requests. With split-KV decode attention the request that parts
// changes with the split size, 16 / 48 / 1024 keys none, 32 / 64 request 4, 128 request 2.)
TEST(CudaHybridEngine, PreemptionGivesTheSameTokensAsAlone) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  constexpr float kNearTie = 0.05f;  // nats
  auto backend = MakeCudaBackend(0);
  ASSERT_TRUE(backend.ok());
  auto model = LoadModel("tests/data/models/qwen3.5-moe-hybrid", **backend);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto request = [](int first_id, int len, int max_tokens) {
    GenerationRequest r;
    for (int i = 0; i < len; ++i) r.prompt.push_back((first_id + 37 * i) % 1024);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    return r;
  };
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 5; ++i) requests.push_back(request(13 * i + 2, 15 + 11 * i, 16));
  std::vector<TracedRun> alone;
  for (const auto& r : requests) {
    auto engine = Engine::Create(**model, **backend, EngineOptions{});
    ASSERT_TRUE(engine.ok());
    alone.push_back(RunTraced(**engine, {r})[0]);
  }
  EngineOptions tight;
  tight.block_size = 4;
  tight.num_kv_blocks = 24;  // 96 slots for the one attention layer of five sequences up to 75
  tight.max_model_len = 96;
  tight.max_batch_tokens = 24;
  tight.max_num_seqs = 3;  // state slots are reused across requests
  auto engine = Engine::Create(**model, **backend, tight);
  ASSERT_TRUE(engine.ok());
  const std::vector<TracedRun> out = RunTraced(**engine, requests);
  EXPECT_GT((*engine)->num_preemptions(), 0);
  int same = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::vector<int32_t>& a = alone[i].ids;
    const std::vector<int32_t>& b = out[i].ids;
    if (a == b) {
      ++same;
      continue;
    }
    // The first token that differs (a run that stopped early parts where the other goes on).
    const size_t n = std::min(a.size(), b.size());
    const size_t first = std::min<size_t>(std::mismatch(a.begin(), a.begin() + n, b.begin()).first - a.begin(),
                                          a.size() - 1);
    const float margin = alone[i].margin[first];
    std::printf("hybrid under preemption: request %zu parts at token %zu of %zu, alone's top-2 margin there %.4g\n",
                i, first, a.size(), margin);
    EXPECT_LT(margin, kNearTie) << "request " << i << " parts at token " << first;
  }
  std::printf("hybrid under preemption (%d preemptions): %d of %zu requests equal to alone\n",
              static_cast<int>((*engine)->num_preemptions()), same, requests.size());
  Record("Engine.hybrid_preemption_equal", std::to_string(requests.size()) + " requests", same, 0);
}

TEST(CudaDemoModel, GreedyChats) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto backend = MakeCudaBackend(0);
  ASSERT_TRUE(backend.ok());
  const std::string dir = "models/corolla-demo";
  auto model = LoadModel(dir, **backend);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto chats = LoadDemoChats(dir, (*model)->config());
  ASSERT_TRUE(chats.ok()) << chats.status().ToString();
  const std::vector<GenerationRequest>& requests = chats->requests;
  auto engine = Engine::Create(**model, **backend, EngineOptions{});
  ASSERT_TRUE(engine.ok());
  auto t0 = std::chrono::steady_clock::now();
  auto out = (*engine)->Generate(requests);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  int matches = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& expected = chats->expected[i];
    const auto& got = (*out)[i].first;
    size_t same = 0;
    while (same < got.size() && same < expected.size() && got[same] == expected[same]) ++same;
    bool exact = got == expected;
    matches += exact;
    std::printf("demo chat %zu: %s (%zu/%zu tokens agree before the first difference)\n", i,
                exact ? "exact" : "DIFFERS", same, expected.size());
  }
  std::printf("demo greedy on CUDA: %d of %zu chats match exactly (%.2f s)\n", matches, requests.size(), secs);
  Record("Demo.greedy_chats_matching", std::to_string(requests.size()) + " chats", matches, 0);
  // bf16 may flip one near-tie; measured 11/11 on every H200 run so far.
  EXPECT_GE(matches, static_cast<int>(requests.size()) - 1);
}

// ---- decode graphs ----------------------------------------------------------------------

// Greedy ids of `requests` through an Engine on `backend`; graphs off when COROLLA_CUDA_GRAPHS=0
// is set while the engine is made. Also the wall time of Generate.
std::vector<std::vector<int32_t>> GreedyIds(Model& model, Backend& backend,
                                            const std::vector<GenerationRequest>& requests, bool graphs,
                                            double* secs = nullptr) {
  if (!graphs) setenv("COROLLA_CUDA_GRAPHS", "0", 1);
  auto engine = Engine::Create(model, backend, EngineOptions{});
  unsetenv("COROLLA_CUDA_GRAPHS");
  EXPECT_TRUE(engine.ok());
  auto t0 = std::chrono::steady_clock::now();
  auto out = (*engine)->Generate(requests);
  if (secs) *secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  std::vector<std::vector<int32_t>> ids;
  for (auto& [tokens, reason] : *out) ids.push_back(tokens);
  return ids;
}

// Requests finishing at different steps, so the decode batch walks down across buckets
// (13 -> bucket 16, then 8, 4, 2, 1).
std::vector<GenerationRequest> MixedRequests() {
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 21; ++i) {  // 21 -> 24 rows, then every size from 16 down
    GenerationRequest r;
    for (int j = 0; j < 5 + 7 * i; ++j) r.prompt.push_back((11 * i + 29 * j + 3) % 1024);
    r.max_tokens = 3 + 5 * i;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    requests.push_back(r);
  }
  return requests;
}

// The demo model's golden chats with graphs on equal graphs off (and the golden ids).
TEST(CudaDecodeGraph, DemoChatsOnEqualsOff) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto backend = MakeCudaBackend(0);
  ASSERT_TRUE(backend.ok());
  const std::string dir = "models/corolla-demo";
  auto model = LoadModel(dir, **backend);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto chats = LoadDemoChats(dir, (*model)->config());
  ASSERT_TRUE(chats.ok()) << chats.status().ToString();
  const std::vector<GenerationRequest>& requests = chats->requests;
  auto on = GreedyIds(**model, **backend, requests, true);
  auto off = GreedyIds(**model, **backend, requests, false);
  int same = 0, golden_same = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    same += on[i] == off[i];
    golden_same += on[i] == chats->expected[i];
    EXPECT_EQ(on[i], off[i]) << "chat " << i;
  }
  std::printf("demo chats with decode graphs: %d/%zu equal graphs off, %d/%zu equal golden\n", same,
              requests.size(), golden_same, requests.size());
  Record("Graph.demo_chats", std::to_string(requests.size()) + " chats on != off", requests.size() - same, 0);
}

class CudaDecodeGraphTest : public ::testing::TestWithParam<std::string> {};

// Greedy generation with graphs on equals graphs off (and is compared with the CPU), with the
// batch changing across buckets as requests finish. A graph pads the batch to its bucket (21 ->
// 24; every size up to 16 is its own), and an op whose arithmetic for a row depends on how many
// rows there are (cuBLASLt picks its algorithm per shape from 3 rows on; the decode attention's
// plan follows the host hints) may move a logit by a rounding step: where the two runs part, the
// graphs-off run's top-2 margin there must be a near-tie, below kNearTie (the hybrid fixture's tiny
// random weights make near-ties common; CudaHybridEngine.PreemptionGivesTheSameTokensAsAlone asks
// the same). A parting at a clear margin fails.
TEST_P(CudaDecodeGraphTest, EngineGreedyOnEqualsOffAndCpu) {
  constexpr float kNearTie = 0.05f;  // nats
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::string name = GetParam();
  auto gpu = MakeCudaBackend(0);
  ASSERT_TRUE(gpu.ok());
  auto cpu = MakeCpuBackend();
  // deepseek-v3-fp8 runs native FP8 GEMMs here (activations quantised per 1 x 128 group; not
  // the default); its CPU reference is then the FP8 twin, and its golden (a float32 forward of
  // the dequantised weights) is ~9e-2 away on that twin too (model/fp8_model_test.cc).
  const bool native_fp8 = name == "deepseek-v3-fp8";
  if (native_fp8) setenv("COROLLA_FP8", "native", 1);
  auto gmodel = LoadModel("tests/data/models/" + name, **gpu);
  ASSERT_TRUE(gmodel.ok()) << gmodel.status().ToString();
  auto cmodel = LoadModel("tests/data/models/" + name, *cpu);
  if (native_fp8) unsetenv("COROLLA_FP8");
  ASSERT_TRUE(cmodel.ok());
  const auto requests = MixedRequests();
  double t_on = 0, t_off = 0;
  GreedyIds(**gmodel, **gpu, requests, true);  // first captures: not timed
  auto on = GreedyIds(**gmodel, **gpu, requests, true, &t_on);
  auto off = GreedyIds(**gmodel, **gpu, requests, false, &t_off);
  auto host = GreedyIds(**cmodel, *cpu, requests, false);
  std::vector<TracedRun>
      off_traced;  // graphs off with the top-2 margins: made once a request parts
  int same_off = 0, same_cpu = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    same_off += on[i] == off[i];
    same_cpu += on[i] == host[i];
    if (on[i] != off[i]) {
      size_t k = 0;
      while (k < on[i].size() && k < off[i].size() && on[i][k] == off[i][k]) ++k;
      if (off_traced.empty()) {
        setenv("COROLLA_CUDA_GRAPHS", "0", 1);
        auto engine = Engine::Create(**gmodel, **gpu, EngineOptions{});
        unsetenv("COROLLA_CUDA_GRAPHS");
        ASSERT_TRUE(engine.ok());
        off_traced = RunTraced(**engine, requests);
      }
      EXPECT_EQ(off_traced[i].ids, off[i])
          << name << " request " << i << ": the traced run is not the same run";
      const float margin = k < off_traced[i].margin.size() ? off_traced[i].margin[k] : INFINITY;
      std::printf(
          "%s request %zu: graphs on vs off differ first at token %zu of %zu, top-2 margin there "
          "%.4g\n",
          name.c_str(), i, k, on[i].size(), margin);
      EXPECT_LT(margin, kNearTie) << name << " request " << i << " parts at token " << k;
    }
    if (on[i] != host[i]) {
      size_t k = 0;
      while (k < on[i].size() && k < host[i].size() && on[i][k] == host[i][k]) ++k;
      std::printf("%s request %zu: graphs vs cpu differ first at token %zu of %zu\n", name.c_str(), i, k,
                  on[i].size());
    }
  }
  std::printf("decode graphs %s: %d/%zu requests equal graphs off, %d/%zu equal cpu; Generate %.3f s on, "
              "%.3f s off\n", name.c_str(), same_off, requests.size(), same_cpu, requests.size(), t_on, t_off);
  Record("Graph." + name, "greedy on == off (13 requests)", requests.size() - same_off, 0);
  Record("Graph." + name, "greedy on == cpu (13 requests)", requests.size() - same_cpu, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaDecodeGraphTest,
                         ::testing::Values("qwen3-dense", "qwen3-moe", "qwen3.5-moe-hybrid"));

// Decode graphs past 64 sequences (up to COROLLA_DECODE_GRAPH_MAX_BATCH): 100 requests of
// different lengths walk the batch down from 100 (bucket 128) through every bucket below it. A
// replay must give the padded buckets' eager forward (kBucketsEager: the same rows, shapes and
// plans) bit for bit, so the greedy ids are equal without a near-tie allowance.
TEST(CudaDecodeGraph, WideBatchReplayEqualsEagerBuckets) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto backend = MakeCudaBackend(0);
  ASSERT_TRUE(backend.ok());
  auto model = LoadModel("tests/data/models/qwen3-moe", **backend);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 100; ++i) {
    GenerationRequest r;
    for (int j = 0; j < 3 + (i * 7) % 40; ++j) r.prompt.push_back((13 * i + 31 * j + 5) % 1024);
    r.max_tokens = 2 + (i * 37) % 61;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    requests.push_back(r);
  }
  setenv("COROLLA_DECODE_GRAPH_MAX_BATCH", "128", 1);
  auto run = [&](DecodeGraphMode mode, int64_t* steps) {
    EngineOptions o;
    o.max_num_seqs = 128;
    o.decode_graphs = mode;
    auto engine = Engine::Create(**model, **backend, o);
    EXPECT_TRUE(engine.ok());
    (*engine)->set_record_steps(true);
    auto out = (*engine)->Generate(requests);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    *steps = 0;
    for (const StepRecord& r : (*engine)->TakeStepRecords())
      *steps += r.graph && r.decode_rows > 64;
    std::vector<std::vector<int32_t>> ids;
    for (auto& [tokens, reason] : *out) ids.push_back(tokens);
    return ids;
  };
  int64_t wide_replays = 0, wide_eager = 0;
  const auto eager = run(DecodeGraphMode::kBucketsEager, &wide_eager);
  const auto replay = run(DecodeGraphMode::kOn, &wide_replays);
  unsetenv("COROLLA_DECODE_GRAPH_MAX_BATCH");
  EXPECT_GT(wide_replays, 0) << "no step of more than 64 sequences replayed a graph";
  EXPECT_EQ(wide_eager, wide_replays) << "the two runs scheduled different steps";
  int same = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    same += replay[i] == eager[i];
    EXPECT_EQ(replay[i], eager[i]) << "request " << i;
  }
  std::printf(
      "decode graphs to 128 rows: %d/%zu requests equal the eager buckets; %lld steps of more "
      "than 64 sequences replayed\n",
      same, requests.size(), static_cast<long long>(wide_replays));
  Record("Graph.wide_batch", "greedy replay == eager buckets (100 requests)",
         requests.size() - same, 0);
}

// ---- async scheduling -------------------------------------------------------------------

// Greedy ids of `requests` through an Engine with async scheduling on or off; also the wall
// time of Generate and how many steps were launched before the previous one was taken.
std::vector<std::vector<int32_t>> AsyncIds(Model& model, Backend& backend, const std::vector<GenerationRequest>& requests,
                                           bool async, double* secs = nullptr, int64_t* async_steps = nullptr) {
  EngineOptions o;
  o.async_scheduling = async;
  auto engine = Engine::Create(model, backend, o);
  EXPECT_TRUE(engine.ok());
  auto t0 = std::chrono::steady_clock::now();
  auto out = (*engine)->Generate(requests);
  if (secs) *secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (async_steps) *async_steps = (*engine)->num_async_steps();
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ((*engine)->num_used_blocks(), 0);
  std::vector<std::vector<int32_t>> ids;
  for (auto& [tokens, reason] : *out) ids.push_back(tokens);
  return ids;
}

// The demo model's golden chats with async scheduling on equal it off: the next step's input
// ids gathered on the device (in the decode graphs too) are the ones the host would upload.
TEST(CudaAsyncScheduling, DemoChatsOnEqualsOff) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto backend = MakeCudaBackend(0);
  ASSERT_TRUE(backend.ok());
  const std::string dir = "models/corolla-demo";
  auto model = LoadModel(dir, **backend);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto chats = LoadDemoChats(dir, (*model)->config());
  ASSERT_TRUE(chats.ok()) << chats.status().ToString();
  const std::vector<GenerationRequest>& requests = chats->requests;
  int64_t async_steps = 0;
  auto on = AsyncIds(**model, **backend, requests, true, nullptr, &async_steps);
  auto off = AsyncIds(**model, **backend, requests, false);
  EXPECT_GT(async_steps, 0);
  int same = 0, golden_same = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    same += on[i] == off[i];
    golden_same += on[i] == chats->expected[i];
    EXPECT_EQ(on[i], off[i]) << "chat " << i;
  }
  std::printf("demo chats with async scheduling: %d/%zu equal it off, %d/%zu equal golden (%lld async steps)\n",
              same, requests.size(), golden_same, requests.size(), static_cast<long long>(async_steps));
  Record("Async.demo_chats", std::to_string(requests.size()) + " chats on != off", requests.size() - same, 0);
}

class CudaAsyncSchedulingTest : public ::testing::TestWithParam<std::string> {};

// Requests finishing at different steps (decode graphs across buckets; MLA eagerly): async on
// equals off. Then one request decoding alone, the time per token with and without overlap.
TEST_P(CudaAsyncSchedulingTest, MixedGreedyOnEqualsOff) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const std::string name = GetParam();
  auto gpu = MakeCudaBackend(0);
  ASSERT_TRUE(gpu.ok());
  auto model = LoadModel("tests/data/models/" + name, **gpu);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const auto requests = MixedRequests();
  AsyncIds(**model, **gpu, requests, true);  // first captures: not compared for time
  auto on = AsyncIds(**model, **gpu, requests, true);
  auto off = AsyncIds(**model, **gpu, requests, false);
  int same = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    same += on[i] == off[i];
    EXPECT_EQ(on[i], off[i]) << name << " request " << i;
  }
  Record("Async." + name, "greedy on == off (13 requests)", requests.size() - same, 0);
  GenerationRequest alone = requests.back();
  alone.max_tokens = 200;
  double t_on = 0, t_off = 0;
  auto one_on = AsyncIds(**model, **gpu, {alone}, true, &t_on);
  auto one_off = AsyncIds(**model, **gpu, {alone}, false, &t_off);
  EXPECT_EQ(one_on, one_off) << name;
  std::printf("async scheduling %s: %d/%zu requests equal it off; batch 1, %d tokens: %.1f us/token on, "
              "%.1f us/token off (%.2fx)\n", name.c_str(), same, requests.size(), alone.max_tokens,
              1e6 * t_on / alone.max_tokens, 1e6 * t_off / alone.max_tokens, t_off / t_on);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaAsyncSchedulingTest,
                         ::testing::Values("qwen3-moe", "qwen3.5-moe-hybrid", "deepseek-v3"));

// A replayed decode step's logits equal the same padded batch run eagerly bit for bit, and the
// unpadded eager step within bf16 tolerance; then the step time with and without graphs.
TEST(CudaDecodeGraph, ReplayedLogitsEqualEager) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto gpu = MakeCudaBackend(0);
  ASSERT_TRUE(gpu.ok());
  auto model = LoadModel("tests/data/models/qwen3-moe", **gpu);
  ASSERT_TRUE(model.ok());
  const int64_t vocab = (*model)->config().vocab_size;
  const int bs = 16, num_seqs = 6;
  KvCache kv(**gpu, (*model)->kv_cache_spec(), 64, bs);
  ModelRunner off(**model, **gpu, kv, DecodeGraphMode::kOff);
  ModelRunner eager(**model, **gpu, kv, DecodeGraphMode::kBucketsEager);
  ModelRunner graph(**model, **gpu, kv, DecodeGraphMode::kOn);
  ASSERT_NE(graph.decode_graphs(), nullptr);
  std::vector<Sequence> seqs(num_seqs);
  for (int i = 0; i < num_seqs; ++i) {
    Sequence& s = seqs[i];
    for (int j = 0; j < 9 + 13 * i; ++j) s.tokens.push_back((7 * i + 31 * j + 1) % 1024);
    s.num_prompt_tokens = s.num_tokens();
    for (int b = 0; b < 8; ++b) s.block_table.push_back(63 - (i * 8 + b));
    ScheduledChunk c{&s, s.num_tokens()};
    Tensor l = off.Execute({&c, 1}, false);
    Tensor h = LogitsToHost(**gpu, l);
    s.num_computed_tokens = s.num_tokens();
    const float* row = h.ptr<float>();
    s.tokens.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
  }
  double worst_exact = 0, worst_bf16 = 0;
  // Batches 6, 5, 3, 4, 1, 2, 6: buckets 8, 8, 4, 4, 1, 2, 8 (padded and exact fits).
  for (int batch : {6, 5, 3, 4, 1, 2, 6}) {
    std::vector<ScheduledChunk> chunks;
    for (int i = 0; i < batch; ++i) chunks.push_back({&seqs[i], 1});
    Tensor le = LogitsToHost(**gpu, eager.Execute(chunks, false));
    Tensor lg = LogitsToHost(**gpu, graph.Execute(chunks, false));
    Tensor lg2 = LogitsToHost(**gpu, graph.Execute(chunks, false));  // a pure replay
    Tensor lo = LogitsToHost(**gpu, off.Execute(chunks, false));
    for (int64_t i = 0; i < batch * vocab; ++i) {
      worst_exact = std::max(worst_exact, static_cast<double>(std::fabs(lg.ptr<float>()[i] - le.ptr<float>()[i])));
      worst_exact = std::max(worst_exact, static_cast<double>(std::fabs(lg2.ptr<float>()[i] - le.ptr<float>()[i])));
      if (!std::isfinite(lg.ptr<float>()[i])) worst_exact = INFINITY;
    }
    for (int i = 0; i < batch; ++i) {
      worst_bf16 = std::max(worst_bf16, RowError(lg.ptr<float>() + i * vocab, lo.ptr<float>() + i * vocab, vocab));
      Sequence& s = seqs[i];
      const float* row = lo.ptr<float>() + i * vocab;
      s.num_computed_tokens += 1;
      s.tokens.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
  }
  std::printf("decode graph replay vs eager same padded batch: max |diff| %.3e; vs unpadded eager %.3e "
              "(of max|ref|); %d graphs captured\n", worst_exact, worst_bf16, graph.decode_graphs()->num_graphs());
  Record("Graph.replay_vs_eager", "qwen3-moe logits, 7 steps", worst_exact, 1e-6);
  Record("Graph.replay_vs_unpadded", "qwen3-moe logits, 7 steps", worst_bf16, 2e-2);
  EXPECT_LE(worst_exact, 1e-6);
  EXPECT_LT(worst_bf16, 2e-2);

  // Step time: the same decode step (its KV rewrite is idempotent), host synchronised each time.
  for (int batch : {1, 6}) {
    std::vector<ScheduledChunk> chunks;
    for (int i = 0; i < batch; ++i) chunks.push_back({&seqs[i], 1});
    auto step_us = [&](ModelRunner& runner) {
      for (int i = 0; i < 3; ++i) runner.Execute(chunks, false);
      (*gpu)->Synchronize();
      auto t0 = std::chrono::steady_clock::now();
      constexpr int kSteps = 50;
      for (int i = 0; i < kSteps; ++i) {
        runner.Execute(chunks, false);
        (*gpu)->Synchronize();
      }
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kSteps;
    };
    const double us_off = step_us(off), us_graph = step_us(graph);
    std::printf("decode step qwen3-moe fixture batch %d: eager %.1f us, graph %.1f us (%.2fx)\n", batch, us_off,
                us_graph, us_off / us_graph);
  }
}

// ---- perf -------------------------------------------------------------------------------
// n values: a 1M-value random block repeated (weights of real size without minutes of RNG).
std::vector<float> TiledRandom(int64_t n, float scale) {
  static const std::vector<float> block = RandomBf16(1 << 20, 1.f);
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = block[(i * 7919) % block.size()] * scale;
  return v;
}

TEST(CudaPerf, HbmCopyAndMoeDecodeLayer) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  {
    const size_t bytes = size_t{4} << 30;
    void *a, *b;
    ASSERT_EQ(cudaMalloc(&a, bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&b, bytes), cudaSuccess);
    cudaMemset(a, 1, bytes);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    std::vector<float> ms;
    for (int i = 0; i < 10; ++i) {
      cudaEventRecord(e0);
      cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float t;
      cudaEventElapsedTime(&t, e0, e1);
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    double bw = 2.0 * bytes / (ms[ms.size() / 2] * 1e-3) / 1e12;
    std::printf("HBM copy: 4 GiB D2D median %.3f ms -> %.2f TB/s (read + write)\n", ms[ms.size() / 2], bw);
    Record("Perf.hbm_copy_TBps", "4GiB D2D", bw, 0);
    cudaFree(a);
    cudaFree(b);
  }
  // One Qwen3-30B-A3B MoE layer's decode work: H 2048, E 128, k 8, I 768, Hq 32, Hk 4, D 128.
  auto gpu_r = MakeCudaBackend(0);
  ASSERT_TRUE(gpu_r.ok());
  Backend& gpu = **gpu_r;
  const int64_t h = 2048, e = 128, k = 8, inter = 768, hq = 32, hk = 4, d = 128;
  Tensor wqkv = Upload(gpu, TiledRandom((hq + 2 * hk) * d * h, 0.02f), {(hq + 2 * hk) * d, h}, DType::kBF16);
  Tensor wo = Upload(gpu, TiledRandom(h * hq * d, 0.02f), {h, hq * d}, DType::kBF16);
  Tensor wr = Upload(gpu, TiledRandom(e * h, 0.02f), {e, h}, DType::kBF16);
  Tensor wgu = Upload(gpu, TiledRandom(e * 2 * inter * h, 0.02f), {e, 2 * inter, h}, DType::kBF16);
  Tensor wd = Upload(gpu, TiledRandom(e * h * inter, 0.02f), {e, h, inter}, DType::kBF16);
  Tensor norm_w = Upload(gpu, TiledRandom(h, 1.f), {h}, DType::kBF16);
  cudaStream_t stream = dynamic_cast<cuda::CudaBackend&>(gpu).stream();
  auto time_us = [&](const std::function<void()>& fn, int iters) { return TimeUs(stream, fn, iters); };
  const cuda::KernelTuning defaults = cuda::Tuning();
  for (int64_t batch : {1, 8, 64, 256}) {
    const int ctx = 1024, bs = 16, blocks_per_seq = ctx / bs;
    const int num_blocks = static_cast<int>(batch) * blocks_per_seq;
    Tensor kc = Upload(gpu, TiledRandom(int64_t{num_blocks} * hk * bs * d, 1.f), {num_blocks, hk, bs, d}, DType::kBF16);
    Tensor vc = Upload(gpu, TiledRandom(int64_t{num_blocks} * hk * bs * d, 1.f), {num_blocks, hk, bs, d}, DType::kBF16);
    std::vector<int32_t> qs{0}, sl, tab, slots, pos;
    for (int b = 0; b < batch; ++b) {
      qs.push_back(b + 1);
      sl.push_back(ctx);
      for (int j = 0; j < blocks_per_seq; ++j) tab.push_back(b * blocks_per_seq + j);
      slots.push_back((b * blocks_per_seq + blocks_per_seq - 1) * bs + bs - 1);
      pos.push_back(ctx - 1);
    }
    Tensor gqs = UploadI32(gpu, qs, {batch + 1}), gsl = UploadI32(gpu, sl, {batch});
    Tensor gtab = UploadI32(gpu, tab, {batch, blocks_per_seq}), gslot = UploadI32(gpu, slots, {batch});
    Tensor gpos = UploadI32(gpu, pos, {batch});
    AttentionBatch ab{gqs, gsl, gtab, gslot, 1, ctx};
    KvCacheView cache{kc, vc};
    Tensor x = Upload(gpu, RandomBf16(batch * h, 1.f), {batch, h}, DType::kBF16);
    Tensor res = Upload(gpu, RandomBf16(batch * h, 1.f), {batch, h}, DType::kBF16);
    Tensor qkv = gpu.Empty(DType::kBF16, {batch, (hq + 2 * hk) * d});
    Tensor attn = gpu.Empty(DType::kBF16, {batch, hq, d});
    Tensor y = gpu.Empty(DType::kBF16, {batch, h});
    Tensor ids = gpu.Empty(DType::kI32, {batch, k}), wts = gpu.Empty(DType::kF32, {batch, k});
    auto heads = [&](int64_t first, int64_t n) {
      TensorView v = qkv.view();
      v.data = static_cast<char*>(v.data) + first * d * 2;
      v.shape = {batch, n, d};
      v.strides = {(hq + 2 * hk) * d, d, 1, 0};
      return v;
    };
    // The ops Qwen3's forward issues for one MoE layer (qwen3.cc).
    MoeRouting routing;
    routing.top_k = static_cast<int>(k);
    auto layer = [&] {
      gpu.Linear(x, wqkv, qkv);
      gpu.QkNormRopeKvWrite(heads(0, hq), heads(hq, hk), heads(hq + hk, hk), norm_w.view().Slice(0, d),
                            norm_w.view().Slice(0, d), 1e-6f, gpos, {static_cast<int>(d), 1e6f}, cache, ab);
      gpu.Attention(heads(0, hq), cache, ab, 0.088f, attn);
      gpu.Linear(attn.view().Reshape({batch, hq * d}), wo, y);
      gpu.RmsNorm(y, norm_w, 1e-6f, x, &res.view());
      gpu.MoeRouter(x, wr, routing, ids, wts);
      gpu.MoeExperts(x, ids, wts, wgu, wd, y);
      gpu.RmsNorm(y, norm_w, 1e-6f, x, &res.view());
    };
    // Host-timed loop of eager launches (launch overheads included), and the same work captured
    // in a CUDA graph and replayed (as a decode step runs).
    auto host_us = [&] {
      layer();
      gpu.Synchronize();
      const int iters = 50;
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) layer();
      gpu.Synchronize();
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    };
    auto graph_us = [&] {
      auto graph = gpu.CaptureGraph([&] {
        for (int i = 0; i < 10; ++i) layer();
      });
      if (!graph.ok()) return -1.0;
      return time_us([&] { (*graph)->Replay(); }, 10) / 10;
    };
    const double us = host_us(), us_graph = graph_us();
    // Before issue 4's batch-1 work: no programmatic dependent launch, router GEMV + MoeRoute,
    // attention splits merged by a separate launch.
    cuda::Tuning().pdl = false;
    cuda::Tuning().fused_router_max_tokens = 0;
    cuda::Tuning().attention_fused_merge = false;
    const double us_old = host_us(), us_graph_old = graph_us();
    cuda::Tuning() = defaults;
    std::printf("decode layer (Qwen3-30B-A3B shapes), batch %ld, ctx %d, graph replay: %.1f us/layer (before: %.1f); "
                "eager: %.1f (before: %.1f)\n",
                static_cast<long>(batch), ctx, us_graph, us_graph_old, us, us_old);
    Record("Perf.decode_layer_graph_us", "B" + std::to_string(batch) + " ctx1024", us_graph, 0);
    Record("Perf.decode_layer_graph_before_us", "B" + std::to_string(batch) + " ctx1024", us_graph_old, 0);
    // Bytes a step must read: attention weights, router, the distinct experts touched (at most
    // min(E, batch * k)), and the KV of every sequence.
    const double experts_touched = std::min<double>(e, batch * k * 0.9 + 1);  // rough: random routing
    const double bytes = 2.0 * ((hq + 2 * hk) * d * h + h * hq * d + e * h) +
                         experts_touched * 2.0 * 3 * inter * h + batch * 2.0 * 2 * ctx * hk * d;
    std::printf("decode layer (Qwen3-30B-A3B shapes), batch %ld, ctx %d: %.1f us/layer, ~%.1f MB read -> %.2f TB/s "
                "(graph replay %.2f TB/s)\n",
                static_cast<long>(batch), ctx, us, bytes / 1e6, bytes / (us * 1e-6) / 1e12,
                bytes / (us_graph * 1e-6) / 1e12);
    Record("Perf.decode_layer_us", "B" + std::to_string(batch) + " ctx1024", us, 0);
    // The two largest parts alone, each variant (distinct experts: E (1 - (1 - k/E)^B)).
    auto moe = [&] { gpu.MoeExperts(x, ids, wts, wgu, wd, y); };
    auto att = [&] { gpu.Attention(heads(0, hq), cache, ab, 0.088f, attn); };
    const double distinct = e * (1.0 - std::pow(1.0 - double(k) / e, double(batch)));
    const double moe_bytes = distinct * 2.0 * 3 * inter * h, kv_bytes = batch * 2.0 * 2 * ctx * hk * d;
    cuda::Tuning().moe_pair_gemv_max_pairs = 0;  // the permuted paths: grouped GEMMs, then streams
    cuda::Tuning().moe_skinny_max_pairs = 0;
    const double moe_tiled = time_us(moe, 20);
    cuda::Tuning().moe_skinny_max_pairs = int64_t{1} << 40;
    const double moe_streams = time_us(moe, 20);
    cuda::Tuning().attention_split_min_ctas = 0;
    const double att_plain = time_us(att, 20);
    cuda::Tuning().attention_split_min_ctas = defaults.attention_split_min_ctas;
    const double att_split = time_us(att, 20);
    cuda::Tuning() = defaults;
    std::printf("  B%ld moe experts (%.1f distinct, %.1f MB): tiled %.1f us (%.2f TB/s), streams %.1f us (%.2f TB/s); "
                "attention (KV %.1f MB): plain %.1f us (%.2f TB/s), split-KV %.1f us (%.2f TB/s)\n",
                static_cast<long>(batch), distinct, moe_bytes / 1e6, moe_tiled, moe_bytes / moe_tiled / 1e6,
                moe_streams, moe_bytes / moe_streams / 1e6, kv_bytes / 1e6, att_plain, kv_bytes / att_plain / 1e6,
                att_split, kv_bytes / att_split / 1e6);
    Record("Perf.moe_tiled_us", "B" + std::to_string(batch), moe_tiled, 0);
    Record("Perf.moe_streams_us", "B" + std::to_string(batch), moe_streams, 0);
    Record("Perf.attn_plain_us", "B" + std::to_string(batch) + " ctx1024", att_plain, 0);
    Record("Perf.attn_split_us", "B" + std::to_string(batch) + " ctx1024", att_split, 0);
  }
}

}  // namespace
}  // namespace corolla::cuda_test

namespace corolla::cuda_test {
namespace {

// Issue 4: a per-head QK RMSNorm kernel (several heads per warp, 16-byte loads) against the
// generic row RMSNorm applied to every head as a row of its own, on the same data. The
// published claim is 2-3x. Times are medians of 50 launches by CUDA events.
TEST(CudaPerf, HeadRmsNormVsGenericRmsNorm) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto backend = MakeCudaBackend(0).value();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  auto time_us = [&](const std::function<void()>& fn) {
    fn();
    std::vector<float> ms;
    for (int i = 0; i < 50; ++i) {
      cudaEventRecord(e0, static_cast<cuda::CudaBackend&>(*backend).stream());
      fn();
      cudaEventRecord(e1, static_cast<cuda::CudaBackend&>(*backend).stream());
      cudaEventSynchronize(e1);
      float t;
      cudaEventElapsedTime(&t, e0, e1);
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return 1000.0 * ms[ms.size() / 2];
  };
  const int64_t d = 128;
  for (int64_t heads : {4, 32}) {
    for (int64_t tokens : {1, 64, 4096}) {
      Tensor x = Upload(*backend, RandomBf16(tokens * heads * d), {tokens, heads, d}, DType::kBF16);
      Tensor w = Upload(*backend, RandomBf16(d), {d}, DType::kBF16);
      Tensor out = backend->Empty(DType::kBF16, {tokens * heads, d});
      const double head_us = time_us([&] { backend->HeadRmsNorm(x, w, 1e-6f); });
      const double row_us =
          time_us([&] { backend->RmsNorm(x.view().Reshape({tokens * heads, d}), w, 1e-6f, out, nullptr); });
      // Same function: the head kernel's result equals the row kernel's.
      Tensor y = Upload(*backend, RandomBf16(tokens * heads * d), {tokens, heads, d}, DType::kBF16);
      backend->RmsNorm(y.view().Reshape({tokens * heads, d}), w, 1e-6f, out, nullptr);
      backend->HeadRmsNorm(y, w, 1e-6f);
      EXPECT_LT(RelError(Download(*backend, y), Download(*backend, out)), 1e-2);
      std::printf("qk norm heads %lld tokens %lld: per-head kernel %.2f us, row RMSNorm per head %.2f us (%.2fx)\n",
                  static_cast<long long>(heads), static_cast<long long>(tokens), head_us, row_us, row_us / head_us);
      Record("Perf.head_norm_speedup", "H" + std::to_string(heads) + " T" + std::to_string(tokens),
             row_us / head_us, 0);
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
}  // namespace corolla::cuda_test
