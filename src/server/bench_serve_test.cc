// `corolla bench serve`'s core against an in-process server on the demo model (CPU): the counts
// add up for closed-loop and Poisson runs, the engine-only baseline runs the same workload, and
// the percentile and error paths behave.
#include "server/bench_serve.h"

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "server/server.h"

namespace corolla::server {
namespace {

const char* kModelDir = "models/corolla-demo";

std::unique_ptr<OpenAiServer> StartDemoServer() {
  ServerOptions so;
  so.http.host = "127.0.0.1";
  so.http.port = 0;
  auto server = OpenAiServer::Start(so).value();
  auto backend = MakeCpuBackend();
  auto model = LoadModel(kModelDir, *backend).value();
  EngineOptions eo;
  eo.max_model_len = 256;
  server->Attach(MakeServedModel(kModelDir, std::move(backend), std::move(model), eo, {}, "").value());
  return server;
}

// The demo model on the CPU behind an Engine with the server's max_model_len, for in-process runs.
struct DemoEngine {
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  std::unique_ptr<Model> model = LoadModel(kModelDir, *backend).value();
  std::unique_ptr<Engine> engine = Engine::Create(*model, *backend, EngineOptions{.max_model_len = 256}).value();
};

void ExpectCountsAddUp(const BenchServeReport& r, const BenchServeOptions& o) {
  EXPECT_EQ(r.num_completed, o.num_prompts) << r.ToText();
  EXPECT_EQ(r.num_failed, 0) << r.ToText();
  EXPECT_EQ(r.total_input_tokens, int64_t{o.num_prompts} * o.input_len);
  EXPECT_EQ(r.total_output_tokens, int64_t{o.num_prompts} * o.output_len);
  EXPECT_GT(r.duration_s, 0);
  EXPECT_NEAR(r.output_throughput, r.total_output_tokens / r.duration_s, 1e-6);
  EXPECT_NEAR(r.request_throughput * r.duration_s, o.num_prompts, 1e-6);
  EXPECT_GT(r.ttft.mean, 0);
  EXPECT_LE(r.ttft.p50, r.ttft.p90);
  EXPECT_LE(r.ttft.p90, r.ttft.p99);
  EXPECT_LE(r.ttft.p99, r.ttft.max);
  EXPECT_LE(r.itl.p99, r.itl.max);
  EXPECT_GT(r.tpot.mean, 0);
  EXPECT_GT(r.itl.mean, 0);
  EXPECT_GE(r.e2e.p50, r.ttft.p50);
}

TEST(BenchServe, CountsAddUpThroughHttpAndInProcess) {
  auto server = StartDemoServer();
  BenchServeOptions o;
  o.url = "http://127.0.0.1:" + std::to_string(server->port()) + "/v1";
  o.num_prompts = 12;
  o.concurrency = 4;
  o.input_len = 40;
  o.output_len = 9;
  o.seed = 3;
  o.num_warmup = 2;  // untimed and uncounted
  int num_progress = 0, last_progress = 0;
  o.on_progress = [&](int done, int total) {
    ++num_progress;
    last_progress = done;
    EXPECT_EQ(total, 12);
  };
  BenchServeReport closed = RunHttpBench(o).value();
  ExpectCountsAddUp(closed, o);
  EXPECT_EQ(closed.model, "corolla-demo");
  EXPECT_EQ(num_progress, 12);
  EXPECT_EQ(last_progress, 12);
  EXPECT_NE(closed.ToText().find("Successful requests:                     12"), std::string::npos) << closed.ToText();
  EXPECT_EQ(closed.ToJson()["total_output_tokens"], 12 * 9);

  // Open loop: Poisson arrivals, no concurrency limit.
  BenchServeOptions poisson = o;
  poisson.on_progress = nullptr;
  poisson.concurrency = 0;
  poisson.request_rate = 40;
  poisson.num_prompts = 8;
  ExpectCountsAddUp(RunHttpBench(poisson).value(), poisson);

  // The server-less baseline: the same workload straight through an Engine.
  DemoEngine demo;
  Engine* engine = demo.engine.get();
  const auto& model = demo.model;
  BenchServeOptions in_process = o;
  in_process.on_progress = nullptr;
  in_process.vocab_size = model->config().vocab_size;
  BenchServeReport direct = RunEngineBench(*engine, in_process).value();
  ExpectCountsAddUp(direct, in_process);
  EXPECT_EQ(engine->num_used_blocks(), 0);
  // Its engine steps: every generated token after a request's first came from a decode row (12 x
  // 8), and the prompts' tokens from steps that prefilled (prefix-cache hits excepted).
  EXPECT_FALSE(closed.steps.has_value());
  ASSERT_TRUE(direct.steps.has_value());
  const StepSummary& dec = direct.steps->decode;
  const StepSummary& mix = direct.steps->mixed;
  EXPECT_GT(dec.steps, 0);
  EXPECT_GT(mix.steps, 0);
  EXPECT_NEAR(dec.decode_rows * dec.steps + mix.decode_rows * mix.steps, 12 * 8, 1e-6);
  EXPECT_EQ(dec.prefill_tokens, 0);
  EXPECT_GT(mix.prefill_tokens * mix.steps, 0);
  EXPECT_LE(mix.prefill_tokens * mix.steps, 12 * 40 + 1e-6);
  EXPECT_GT(dec.p50, 0);
  EXPECT_LE(dec.p50, dec.p90);
  EXPECT_EQ(direct.ToJson()["steps"]["decode"]["steps"], dec.steps);
  EXPECT_NE(direct.ToText().find("Decode-only steps (graphs):"), std::string::npos)
      << direct.ToText();

  // Every KV block came back on the server too.
  for (int i = 0; i < 200 && server->Stats()->num_used_kv_blocks > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(server->Stats()->num_used_kv_blocks, 0);
}

// --temperature and the rest reach the server as request fields it accepts (a rejected body would
// count as failures) and the engine in-process; bad values are errors before anything is sent.
TEST(BenchServe, SampledRequestsThroughHttpAndInProcess) {
  auto server = StartDemoServer();
  BenchServeOptions o;
  o.url = "http://127.0.0.1:" + std::to_string(server->port());
  o.num_prompts = 6;
  o.concurrency = 3;
  o.input_len = 16;
  o.output_len = 5;
  o.seed = 11;
  o.temperature = 0.7;
  o.top_k = 20;
  o.top_p = 0.9;
  o.min_p = 0.05;
  BenchServeReport http = RunHttpBench(o).value();
  ExpectCountsAddUp(http, o);
  EXPECT_EQ(http.sampling, "temperature 0.7, top_k 20, top_p 0.9, min_p 0.05");
  EXPECT_EQ(http.ToJson()["sampling"], http.sampling);
  EXPECT_NE(http.ToText().find("Sampling:"), std::string::npos);

  DemoEngine demo;
  Engine* engine = demo.engine.get();
  const auto& model = demo.model;
  BenchServeOptions in_process = o;
  in_process.vocab_size = model->config().vocab_size;
  ExpectCountsAddUp(RunEngineBench(*engine, in_process).value(), in_process);

  EXPECT_NE(SamplingSeed(11, 0), SamplingSeed(11, 1));
  EXPECT_NE(SamplingSeed(11, 0), SamplingSeed(12, 0));
  BenchServeOptions greedy;
  greedy.url = o.url;
  greedy.num_prompts = 1;
  greedy.input_len = 4;
  greedy.output_len = 2;
  EXPECT_EQ(RunHttpBench(greedy).value().sampling, "greedy");

  for (auto bad : std::vector<std::function<void(BenchServeOptions&)>>{
           [](BenchServeOptions& b) { b.temperature = -1; }, [](BenchServeOptions& b) { b.top_k = -1; },
           [](BenchServeOptions& b) { b.top_p = 0; }, [](BenchServeOptions& b) { b.top_p = 1.5; },
           [](BenchServeOptions& b) { b.min_p = 2; }}) {
    BenchServeOptions b = o;
    bad(b);
    Result<BenchServeReport> r = RunHttpBench(b);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    EXPECT_FALSE(RunEngineBench(*engine, b).ok());
  }
}

TEST(BenchServe, FailuresAreCountedAndBadTargetsAreErrors) {
  auto server = StartDemoServer();
  BenchServeOptions o;
  o.url = "http://127.0.0.1:" + std::to_string(server->port());
  o.num_prompts = 3;
  o.input_len = 8;
  o.output_len = 2;
  o.model = "no-such-model";  // every request gets a 404
  BenchServeReport r = RunHttpBench(o).value();
  EXPECT_EQ(r.num_completed, 0);
  EXPECT_EQ(r.num_failed, 3);
  ASSERT_FALSE(r.first_errors.empty());
  EXPECT_NE(r.first_errors[0].find("HTTP 404"), std::string::npos) << r.first_errors[0];

  o.model.clear();
  o.input_len = 255;  // with 2 output tokens, over max_model_len 256
  EXPECT_FALSE(RunHttpBench(o).ok());
  o.url = "ftp://127.0.0.1:1";
  EXPECT_FALSE(RunHttpBench(o).ok());
  server.reset();
  o.url = "http://127.0.0.1:1";  // nobody listens
  EXPECT_FALSE(RunHttpBench(o).ok());
}

TEST(BenchServe, PercentilesInterpolateLikeNumpy) {
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
  EXPECT_DOUBLE_EQ(Percentile({5}, 99), 5);
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 90), 9.1);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3}, 100), 3);
  BenchServeOptions o;
  o.num_prompts = 3;
  o.input_len = 5;
  auto a = RandomPrompts(o, 7), b = RandomPrompts(o, 7);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 3u);
  for (const auto& p : a) {
    ASSERT_EQ(p.size(), 5u);
    for (int32_t t : p) EXPECT_TRUE(t >= 0 && t < 7);
  }
  EXPECT_NE(a[0], a[1]);
}

}  // namespace
}  // namespace corolla::server
