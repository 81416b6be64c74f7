// The OpenAI server end to end over real HTTP on an ephemeral port, with the built-in demo
// model on the CPU: golden chats (streaming and not), the error objects of bad requests, a
// load test, client disconnects, seeds, stop strings, logprobs; plus the stop-string matcher
// and a bounded fuzz of the request parser.
#include "server/server.h"

#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "model/random_weights.h"
#include "server/openai_protocol.h"
#include "server/stop_strings.h"

namespace corolla::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using json = nlohmann::json;

const char* kModelDir = "models/corolla-demo";

struct Reply {
  int status = 0;
  std::string body;
  std::vector<json> events;  // SSE data events (without [DONE])
  bool done = false;         // saw data: [DONE]
  json Json() const { return json::parse(body, nullptr, false); }
};

std::vector<json> ParseSse(const std::string& body, bool* done) {
  std::vector<json> events;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) != 0) continue;
    std::string data = line.substr(6);
    if (data == "[DONE]") {
      *done = true;
    } else {
      events.push_back(json::parse(data, nullptr, false));
    }
  }
  return events;
}

Reply Request(int port, const std::string& method, const std::string& target, const std::string& body,
              const std::string& auth = "") {
  Reply reply;
  try {
    net::io_context ioc;
    beast::tcp_stream stream(ioc);
    stream.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
    stream.expires_after(std::chrono::seconds(120));
    http::request<http::string_body> req(method == "GET" ? http::verb::get : http::verb::post, target, 11);
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    if (!auth.empty()) req.set(http::field::authorization, auth);
    req.body() = body;
    req.prepare_payload();
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    http::read(stream, buffer, parser);
    reply.status = parser.get().result_int();
    reply.body = parser.get().body();
    reply.events = ParseSse(reply.body, &reply.done);
  } catch (const std::exception& e) {
    reply.status = -1;
    reply.body = e.what();
  }
  return reply;
}

Reply Post(int port, const std::string& target, const json& body, const std::string& auth = "") {
  return Request(port, "POST", target, body.dump(), auth);
}

// The concatenated content of a chat stream (or text of a completion stream).
std::string StreamText(const Reply& r, std::string* finish_reason = nullptr) {
  std::string text;
  for (const auto& e : r.events) {
    if (!e.contains("choices") || e["choices"].empty()) continue;
    const json& c = e["choices"][0];
    if (c.contains("delta") && c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
    if (c.contains("text")) text += c["text"].get<std::string>();
    if (finish_reason && !c["finish_reason"].is_null()) *finish_reason = c["finish_reason"];
  }
  return text;
}

struct TestServer {
  std::unique_ptr<OpenAiServer> server;
  int port() const { return server->port(); }
};

TestServer StartServer(EngineOptions eo = {}, AsyncEngineOptions ao = {}, ServerOptions so = {}) {
  so.http.host = "127.0.0.1";
  so.http.port = 0;
  TestServer t;
  t.server = OpenAiServer::Start(so).value();
  auto backend = MakeCpuBackend();
  auto model = LoadModel(kModelDir, *backend).value();
  t.server->Attach(MakeServedModel(kModelDir, std::move(backend), std::move(model), eo, ao, "").value());
  return t;
}

json Golden() {
  std::ifstream in(std::string(kModelDir) + "/golden-chat.json");
  return json::parse(in);
}

// Polls until the engine is idle with every KV block free.
bool WaitIdle(OpenAiServer& s, int timeout_ms = 20000) {
  for (int i = 0; i < timeout_ms / 10; ++i) {
    EngineStats st = *s.Stats();
    if (st.num_running == 0 && st.num_waiting == 0 && st.num_used_kv_blocks == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EngineOptions eo;
    eo.max_model_len = 512;
    shared_ = new TestServer(StartServer(eo));
  }
  static void TearDownTestSuite() {
    delete shared_;
    shared_ = nullptr;
  }
  int port() const { return shared_->port(); }
  OpenAiServer& server() { return *shared_->server; }
  static TestServer* shared_;
};
TestServer* ServerTest::shared_ = nullptr;

TEST_F(ServerTest, GoldenChatsGreedyStreamingAndNot) {
  json golden = Golden();
  ASSERT_GE(golden["chats"].size(), 1u);
  for (const auto& chat : golden["chats"]) {
    json req = {{"model", "corolla-demo"}, {"messages", chat["messages"]}, {"temperature", 0}, {"max_tokens", 100}};
    Reply r = Post(port(), "/v1/chat/completions", req);
    ASSERT_EQ(r.status, 200) << r.body;
    json j = r.Json();
    EXPECT_EQ(j["choices"][0]["message"]["content"], chat["greedy_text"]);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(j["usage"]["prompt_tokens"], chat["prompt_ids"].size());
    EXPECT_EQ(j["usage"]["completion_tokens"], chat["greedy_ids"].size());

    req["stream"] = true;
    req["stream_options"] = {{"include_usage", true}};
    Reply s = Post(port(), "/v1/chat/completions", req);
    ASSERT_EQ(s.status, 200);
    EXPECT_TRUE(s.done);
    std::string reason;
    EXPECT_EQ(StreamText(s, &reason), chat["greedy_text"].get<std::string>());
    EXPECT_EQ(reason, "stop");
    ASSERT_FALSE(s.events.empty());
    EXPECT_EQ(s.events.front()["choices"][0]["delta"]["role"], "assistant");
    EXPECT_EQ(s.events.back()["usage"]["completion_tokens"], chat["greedy_ids"].size());
  }
}

TEST_F(ServerTest, CompletionsTokenizeModelsHealthMetrics) {
  json golden = Golden();
  const json& chat = golden["chats"][0];
  Reply r = Post(port(), "/v1/completions", {{"prompt", chat["prompt_ids"]}, {"temperature", 0}, {"max_tokens", 50}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["choices"][0]["text"], chat["greedy_text"]);
  Reply text = Post(port(), "/v1/completions",
                    {{"prompt", chat["prompt_text"]}, {"temperature", 0}, {"max_tokens", 50}, {"echo", true}, {"logprobs", 2}});
  ASSERT_EQ(text.status, 200) << text.body;
  json c = text.Json()["choices"][0];
  EXPECT_EQ(c["text"], chat["prompt_text"].get<std::string>() + chat["greedy_text"].get<std::string>());
  EXPECT_EQ(c["logprobs"]["tokens"].size(), chat["greedy_ids"].size());
  EXPECT_EQ(c["logprobs"]["top_logprobs"][0].size(), 2u);

  Reply tok = Post(port(), "/tokenize", {{"messages", chat["messages"]}});
  ASSERT_EQ(tok.status, 200) << tok.body;
  EXPECT_EQ(tok.Json()["tokens"], chat["prompt_ids"]);
  Reply detok = Post(port(), "/detokenize", {{"tokens", chat["prompt_ids"]}});
  EXPECT_EQ(detok.Json()["prompt"], chat["prompt_text"]);

  Reply models = Request(port(), "GET", "/v1/models", "");
  EXPECT_EQ(models.Json()["data"][0]["id"], "corolla-demo");
  EXPECT_EQ(Request(port(), "GET", "/health", "").status, 200);
  Reply metrics = Request(port(), "GET", "/metrics", "");
  EXPECT_NE(metrics.body.find("corolla:time_to_first_token_seconds_bucket"), std::string::npos);
  EXPECT_NE(metrics.body.find("corolla:prefix_cache_hits_total"), std::string::npos);
  EXPECT_NE(metrics.body.find("finished_reason=\"stop\""), std::string::npos);
  // The engine's steps: both requests prefilled and then decoded, and every histogram's +Inf
  // bucket holds its count. Its counts are the engine's (the server is shared by the tests, so
  // at least these two requests').
  const EngineStats stats = *server().Stats();
  EXPECT_GE(stats.steps.mixed_seconds.count(), 2u);
  EXPECT_GE(stats.steps.decode_seconds.count(), 1u);
  EXPECT_EQ(stats.steps.tokens.count(),
            stats.steps.mixed_seconds.count() + stats.steps.decode_seconds.count());
  EXPECT_GE(stats.steps.tokens.sum(), static_cast<double>(stats.steps.tokens.count()));
  for (const char* name :
       {"corolla:engine_step_duration_seconds", "corolla:iteration_tokens_total"}) {
    std::smatch inf, count;
    const std::string n = name;
    ASSERT_TRUE(std::regex_search(metrics.body, inf,
                                  std::regex(n + "_bucket\\{[^}]*le=\"\\+Inf\"\\} ([0-9]+)")))
        << metrics.body;
    ASSERT_TRUE(
        std::regex_search(metrics.body, count, std::regex(n + "_count\\{[^}]*\\} ([0-9]+)")))
        << metrics.body;
    EXPECT_EQ(inf[1], count[1]) << name;
    EXPECT_GT(std::stoll(count[1]), 0) << name;
  }
  EXPECT_NE(metrics.body.find("kind=\"mixed\""), std::string::npos);
}

TEST_F(ServerTest, LogprobsStopStringsAndSeeds) {
  json golden = Golden();
  const json& chat = golden["chats"][1];  // "The capital of Japan is Tokyo."
  json req = {{"messages", chat["messages"]}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 3}};
  json j = Post(port(), "/v1/chat/completions", req).Json();
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), chat["greedy_ids"].size());
  for (const auto& e : content) {
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);  // greedy
  }
  std::string text = chat["greedy_text"];
  json stop_req = {{"messages", chat["messages"]}, {"temperature", 0}, {"stop", {"Tokyo", "zzz"}}};
  json stopped = Post(port(), "/v1/chat/completions", stop_req).Json();
  EXPECT_EQ(stopped["choices"][0]["message"]["content"], text.substr(0, text.find("Tokyo")));
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
  stop_req["stream"] = true;
  std::string reason;
  EXPECT_EQ(StreamText(Post(port(), "/v1/chat/completions", stop_req), &reason), text.substr(0, text.find("Tokyo")));
  EXPECT_EQ(reason, "stop");

  // The same seed gives the same text alone and inside a busy batch (the sampler draws from a
  // counter-based stream keyed by the seed, and each row's logits do not depend on the batch).
  json seeded = {{"prompt", "Once upon a time"}, {"temperature", 1.0}, {"seed", 1234}, {"max_tokens", 24}, {"ignore_eos", true}};
  std::string alone = Post(port(), "/v1/completions", seeded).Json()["choices"][0]["text"];
  std::vector<std::thread> noise;
  std::vector<std::string> busy(4);
  for (int i = 0; i < 12; ++i) {
    noise.emplace_back([&, i] {
      if (i < 4) {
        busy[i] = Post(port(), "/v1/completions", seeded).Json()["choices"][0]["text"];
      } else {
        Post(port(), "/v1/completions", {{"prompt", "noise " + std::to_string(i)}, {"max_tokens", 30 + i}, {"ignore_eos", true}});
      }
    });
  }
  for (auto& t : noise) t.join();
  for (const auto& b : busy) EXPECT_EQ(b, alone);
  json other = seeded;
  other["seed"] = 99;
  EXPECT_NE(Post(port(), "/v1/completions", other).Json()["choices"][0]["text"], alone);
}

// n choices: each its own sampling stream (seed + index), streamed with their indexes; the
// shared prompt is computed once (the other choices find it in the prefix cache).
TEST_F(ServerTest, SeveralChoicesShareThePromptAndSampleIndependently) {
  json golden = Golden();
  const json& chat = golden["chats"][0];
  json req = {{"messages", chat["messages"]}, {"temperature", 0}, {"n", 3}};
  Reply r = Post(port(), "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["message"]["content"], chat["greedy_text"]);
    EXPECT_EQ(j["choices"][i]["finish_reason"], "stop");
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], chat["prompt_ids"].size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 3 * chat["greedy_ids"].size());

  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  Reply s = Post(port(), "/v1/chat/completions", req);
  ASSERT_EQ(s.status, 200);
  EXPECT_TRUE(s.done);
  std::vector<std::string> texts(3), reasons(3);
  std::vector<int> roles(3, 0);
  for (const auto& e : s.events) {
    if (!e.contains("choices") || e["choices"].empty()) continue;
    const json& c = e["choices"][0];
    int i = c["index"];
    ASSERT_TRUE(i >= 0 && i < 3);
    if (c["delta"].contains("role")) ++roles[i];
    if (c["delta"].contains("content")) texts[i] += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) reasons[i] = c["finish_reason"];
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(texts[i], chat["greedy_text"].get<std::string>()) << i;
    EXPECT_EQ(reasons[i], "stop") << i;
    EXPECT_EQ(roles[i], 1) << i;
  }
  EXPECT_EQ(s.events.back()["usage"]["completion_tokens"], 3 * chat["greedy_ids"].size());

  // Sampling: choice i draws from seed + i, so it equals a single request with that seed.
  std::vector<int32_t> prompt;
  for (int i = 0; i < 90; ++i) prompt.push_back(300 + 7 * i);  // 5 full blocks of 16 before the last token
  json sampled = {{"prompt", prompt}, {"temperature", 1.0}, {"seed", 77}, {"max_tokens", 12}, {"ignore_eos", true}, {"n", 4}};
  EngineStats before = *server().Stats();
  Reply many = Post(port(), "/v1/completions", sampled);
  EngineStats after = *server().Stats();
  ASSERT_EQ(many.status, 200) << many.body;
  const json choices = many.Json()["choices"];
  ASSERT_EQ(choices.size(), 4u);
  // The three followers each found the leader's 5 full prompt blocks cached.
  EXPECT_GE(after.prefix_cache_hits - before.prefix_cache_hits, 3 * 80);
  std::set<std::string> distinct;
  for (int i = 0; i < 4; ++i) {
    json one = sampled;
    one.erase("n");
    one["seed"] = 77 + i;
    const json& c = choices[i];
    EXPECT_EQ(c["index"], i);
    EXPECT_EQ(c["text"], Post(port(), "/v1/completions", one).Json()["choices"][0]["text"]) << i;
    distinct.insert(c["text"].get<std::string>());
  }
  EXPECT_GT(distinct.size(), 1u);
  EXPECT_TRUE(WaitIdle(server()));
}

void ExpectError(const Reply& r, int status, const std::string& param = "") {
  EXPECT_EQ(r.status, status) << r.body;
  json j = r.Json();
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"]["type"].is_string());
  EXPECT_TRUE(j["error"].contains("param") && j["error"].contains("code"));
  if (!param.empty()) {
    EXPECT_EQ(j["error"]["param"], param) << r.body;
  }
}

TEST_F(ServerTest, BadRequestsGetOpenAiErrors) {
  const std::string chat = "/v1/chat/completions";
  json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  ExpectError(Request(port(), "POST", chat, "{\"messages\": [}"), 400);
  ExpectError(Request(port(), "POST", chat, "[1, 2]"), 400);
  ExpectError(Post(port(), chat, {{"messages", "hello"}}), 400, "messages");
  ExpectError(Post(port(), chat, {{"messages", msgs}, {"temperature", "hot"}}), 400, "temperature");
  ExpectError(Post(port(), chat, {{"messages", msgs}, {"stream", 1}}), 400, "stream");
  ExpectError(Post(port(), chat, {{"messages", msgs}, {"model", "gpt-4"}}), 404, "model");
  ExpectError(Post(port(), chat, {{"messages", json::array()}}), 400, "messages");
  ExpectError(Post(port(), chat, {{"messages", msgs}, {"max_tokens", 0}}), 400, "max_tokens");
  ExpectError(Post(port(), chat, {{"messages", msgs}, {"max_tokens", 100000}}), 400, "max_tokens");
  ExpectError(Post(port(), chat, {{"messages", msgs}, {"n", 0}}), 400, "n");
  ExpectError(Post(port(), chat, {{"messages", msgs}, {"n", 129}}), 400, "n");
  ExpectError(Post(port(), chat, {{"messages", msgs}, {"top_logprobs", 3}}), 400, "top_logprobs");
  std::string long_text;
  for (int i = 0; i < 800; ++i) long_text += "capital of Japan ";
  ExpectError(Post(port(), chat, {{"messages", {{{"role", "user"}, {"content", long_text}}}}}), 400, "messages");
  ExpectError(Post(port(), "/v1/completions", {{"prompt", json::array({1, 2, 99999})}}), 400, "prompt");
  ExpectError(Request(port(), "POST", chat, std::string(9 << 20, ' ')), 413);
  // 100k nested arrays (200 KB) once overflowed the stack of the thread that parsed them.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  ExpectError(Request(port(), "POST", chat, R"({"messages": [{"role": "user", "content": "hi", "x": )" + deep + "}]}"),
              400);
  ExpectError(Request(port(), "GET", "/v1/nothing", ""), 404);
  ExpectError(Request(port(), "GET", chat, ""), 405);
}

TEST(ServerAuth, ApiKeyAndQueueLimit) {
  ServerOptions so;
  so.api_key = "sk-test";
  EngineOptions eo;
  eo.max_num_seqs = 1;
  AsyncEngineOptions ao;
  ao.max_waiting = 2;
  TestServer t = StartServer(eo, ao, so);
  json body = {{"prompt", "hello"}, {"max_tokens", 40}, {"ignore_eos", true}};
  ExpectError(Post(t.port(), "/v1/completions", body), 401);
  ExpectError(Post(t.port(), "/v1/completions", body, "Bearer wrong"), 401);
  EXPECT_EQ(Request(t.port(), "GET", "/health", "").status, 200);  // not behind the key
  EXPECT_EQ(Post(t.port(), "/v1/completions", body, "Bearer sk-test").status, 200);
  std::vector<int> statuses(16);
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i)
    threads.emplace_back([&, i] { statuses[i] = Post(t.port(), "/v1/completions", body, "Bearer sk-test").status; });
  for (auto& th : threads) th.join();
  int ok = std::count(statuses.begin(), statuses.end(), 200), full = std::count(statuses.begin(), statuses.end(), 429);
  EXPECT_EQ(ok + full, 16);
  EXPECT_GT(full, 0);
  EXPECT_GT(ok, 0);
  EXPECT_TRUE(WaitIdle(*t.server));
}

// `corolla serve --config CONFIG.json --random-weights`: random weights of the demo model's
// shape and no tokenizer. Token-id completions work (streamed as token_ids); what needs text
// answers 400 no_tokenizer.
TEST(ServerWithoutTokenizer, TokenIdCompletionsWorkAndTextEndpointsAnswer400) {
  ServerOptions so;
  so.http.port = 0;
  auto server = OpenAiServer::Start(so).value();
  auto backend = MakeCpuBackend();
  ModelConfig config = LoadModelConfig(kModelDir).value();
  config.num_layers = 2;
  auto model = LoadModelRandom(config, *backend, 1).value();
  server->Attach(MakeServedModel("", std::move(backend), std::move(model), {}, {}, "random").value());
  const int port = server->port();
  EXPECT_EQ(Request(port, "GET", "/health", "").status, 200);
  EXPECT_EQ(Request(port, "GET", "/v1/models", "").Json()["data"][0]["id"], "random");

  const json prompt = {5, 17, 300, 42, 9};
  json body = {{"prompt", prompt}, {"max_tokens", 6}, {"ignore_eos", true}, {"temperature", 0}};
  Reply whole = Post(port, "/v1/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json choice = whole.Json()["choices"][0];
  EXPECT_EQ(choice["text"], "");
  ASSERT_EQ(choice["token_ids"].size(), 6u);
  EXPECT_EQ(whole.Json()["usage"]["completion_tokens"], 6);

  // Streaming: one chunk per token, the same greedy ids.
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Reply stream = Post(port, "/v1/completions", body);
  ASSERT_EQ(stream.status, 200) << stream.body;
  EXPECT_TRUE(stream.done);
  json streamed = json::array();
  for (const json& e : stream.events)
    if (!e["choices"].empty() && e["choices"][0].contains("token_ids"))
      for (const json& id : e["choices"][0]["token_ids"]) streamed.push_back(id);
  EXPECT_EQ(streamed, choice["token_ids"]);

  auto expect_no_tokenizer = [](const Reply& r) {
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.Json()["error"]["code"], "no_tokenizer") << r.body;
    EXPECT_NE(r.Json()["error"]["message"].get<std::string>().find("this model has no tokenizer"), std::string::npos);
  };
  expect_no_tokenizer(Post(port, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}}));
  expect_no_tokenizer(Post(port, "/v1/completions", {{"prompt", "hello"}, {"max_tokens", 2}}));
  expect_no_tokenizer(Post(port, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 2}, {"echo", true}}));
  expect_no_tokenizer(Post(port, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 2}, {"stop", "x"}}));
  expect_no_tokenizer(Post(port, "/tokenize", {{"prompt", "hello"}}));
  expect_no_tokenizer(Post(port, "/detokenize", {{"tokens", prompt}}));
  EXPECT_TRUE(WaitIdle(*server));
}

TEST(ServerLoading, HealthIs503UntilAttached) {
  ServerOptions so;
  so.http.port = 0;
  auto s = OpenAiServer::Start(so).value();
  ExpectError(Request(s->port(), "GET", "/health", ""), 503);
  ExpectError(Post(s->port(), "/v1/completions", {{"prompt", "x"}}), 503);
}

TEST_F(ServerTest, LoadManyConcurrentStreamsAllEndCleanly) {
  constexpr int kClients = 500;
  std::mt19937 rng(7);
  std::vector<json> bodies;
  for (int i = 0; i < kClients; ++i) {
    int max_tokens = 1 + rng() % 40;
    json b = {{"stream", true}, {"max_tokens", max_tokens}, {"ignore_eos", i % 2 == 0}, {"seed", i}};
    if (i % 3 == 0) {
      b["messages"] = {{{"role", "user"}, {"content", "What is " + std::to_string(i) + " + 5?"}}};
    } else {
      b["prompt"] = std::string(1 + rng() % 200, 'a' + i % 26);
    }
    bodies.push_back(b);
  }
  std::vector<Reply> replies(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      replies[i] = Post(port(), bodies[i].contains("messages") ? "/v1/chat/completions" : "/v1/completions", bodies[i]);
    });
  for (auto& t : threads) t.join();
  int num_streamed = 0;
  for (int i = 0; i < kClients; ++i) {
    const Reply& r = replies[i];
    if (r.status == 429) continue;  // a proper error is an acceptable end
    ASSERT_EQ(r.status, 200) << i << ": " << r.body;
    ++num_streamed;
    EXPECT_TRUE(r.done) << i;
    std::string reason;
    StreamText(r, &reason);
    EXPECT_TRUE(reason == "length" || reason == "stop") << i << ": " << reason;
  }
  EXPECT_EQ(num_streamed, kClients);  // the queue (1024) holds them all
  EXPECT_TRUE(WaitIdle(server()));
  EXPECT_EQ(Request(port(), "GET", "/health", "").status, 200);
}

TEST_F(ServerTest, DisconnectedClientsAreCancelledAndFreeTheirBlocks) {
  constexpr int kClients = 100;
  json body = {{"prompt", "tell me a long story"}, {"stream", true}, {"max_tokens", 400}, {"ignore_eos", true}};
  std::string payload = body.dump();
  std::vector<std::thread> threads;
  std::atomic<int> got_data{0};
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&] {
      net::io_context ioc;
      tcp::socket sock(ioc);
      sock.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port())));
      std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                        std::to_string(payload.size()) + "\r\n\r\n" + payload;
      net::write(sock, net::buffer(req));
      char buf[512];
      boost::system::error_code ec;
      size_t n = sock.read_some(net::buffer(buf), ec);
      if (!ec && n > 0) ++got_data;
      sock.close();
    });
  // Meanwhile a normal request is unaffected.
  json golden = Golden();
  Reply r = Post(port(), "/v1/chat/completions", {{"messages", golden["chats"][0]["messages"]}, {"temperature", 0}});
  EXPECT_EQ(r.Json()["choices"][0]["message"]["content"], golden["chats"][0]["greedy_text"]);
  for (auto& t : threads) t.join();
  EXPECT_EQ(got_data.load(), kClients);
  EXPECT_TRUE(WaitIdle(server(), 10000)) << "cancelled requests still hold blocks";
  Reply metrics = Request(port(), "GET", "/metrics", "");
  EXPECT_NE(metrics.body.find("finished_reason=\"abort\"} "), std::string::npos);
}

TEST(StopStringMatcher, HoldsBackPartialMatches) {
  StopStringMatcher m({"STOP", "xy"});
  bool stopped = false;
  EXPECT_EQ(m.Push("hello S", &stopped), "hello ");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(m.Push("T", &stopped), "");
  EXPECT_EQ(m.Push("ar", &stopped), "STar");
  EXPECT_EQ(m.Push("x", &stopped), "");
  EXPECT_EQ(m.Push("yz", &stopped), "");
  EXPECT_TRUE(stopped);
  StopStringMatcher n({"END"});
  EXPECT_EQ(n.Push("the E", &stopped), "the ");
  EXPECT_EQ(n.Flush(), "E");
  StopStringMatcher none({});
  EXPECT_EQ(none.Push("abc", &stopped), "abc");
}

TEST(RequestParser, FuzzNeverCrashesAndAlwaysDecides) {
  std::vector<std::string> seeds = {
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"temperature":0.5,"stop":["a","b"],"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":2})",
      R"({"prompt":[1,2,3],"echo":true,"logprobs":3,"seed":-4,"top_k":5,"min_p":0.1,"presence_penalty":1.5})",
      R"({"messages":[{"role":"system","content":[{"type":"text","text":"x"}]},{"role":"assistant","content":null}],"n":1})"};
  std::mt19937 rng(12345);
  const std::string alphabet = "{}[]\":,0123456789.-eEtrufalsn \\abcxyz";
  auto start = std::chrono::steady_clock::now();
  int iterations = 0;
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(3) && iterations < 200000) {
    std::string s = seeds[rng() % seeds.size()];
    int edits = 1 + rng() % 6;
    for (int e = 0; e < edits && !s.empty(); ++e) {
      size_t pos = rng() % s.size();
      switch (rng() % 3) {
        case 0: s[pos] = alphabet[rng() % alphabet.size()]; break;
        case 1: s.erase(pos, 1 + rng() % 4); break;
        default: s.insert(pos, 1, alphabet[rng() % alphabet.size()]);
      }
    }
    ChatRequest chat;
    CompletionRequest completion;
    auto e1 = ParseChatRequest(s, &chat);
    auto e2 = ParseCompletionRequest(s, &completion);
    if (e1) {
      EXPECT_GE(e1->status, 400);
      EXPECT_FALSE(e1->message.empty());
      EXPECT_TRUE(json::parse(e1->ToJson(), nullptr, false).is_object());
    }
    if (e2) {
      EXPECT_GE(e2->status, 400);
    }
    ++iterations;
  }
  EXPECT_GT(iterations, 1000);
}

}  // namespace
}  // namespace corolla::server
