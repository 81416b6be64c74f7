// `corolla serve --dp 2 --ep 2` end to end on the CPU: the launcher starts two ranks, rank 0
// serves HTTP, requests spread over both. Concurrent greedy completions (more than ranks,
// different lengths, one streamed, one cancelled midway by closing its connection) must equal
// what one `corolla generate` process gives; the server must survive the cancel, answer a too
// long prompt as one process does, and stop every rank on SIGTERM to the launcher.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <regex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "parallel/run_corolla.h"

namespace corolla {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// --- a minimal HTTP/1.1 client (one request per connection) ----------------------------------

int ConnectTo(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{60, 0};  // a hung server fails the test instead of hanging it
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

bool SendRequest(int fd, const std::string& method, const std::string& path, const std::string& body) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                    "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  return ::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size());
}

struct Reply {
  int status = -1;
  std::string body;  // de-chunked
  json Json() const { return json::parse(body, nullptr, false); }
  // The data events of a stream, without [DONE].
  std::vector<json> Events() const {
    std::vector<json> events;
    std::istringstream in(body);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("data: ", 0) == 0 && line != "data: [DONE]") events.push_back(json::parse(line.substr(6), nullptr, false));
    return events;
  }
};

Reply ParseReply(const std::string& raw) {
  Reply r;
  const size_t end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  const std::string headers = raw.substr(0, end);
  std::string body = raw.substr(end + 4);
  if (headers.find("Transfer-Encoding: chunked") == std::string::npos) {
    r.body = body;
    return r;
  }
  for (size_t pos = 0; pos < body.size();) {
    const size_t eol = body.find("\r\n", pos);
    if (eol == std::string::npos) break;
    const size_t n = std::stoul(body.substr(pos, eol - pos), nullptr, 16);
    if (n == 0) break;
    r.body += body.substr(eol + 2, n);
    pos = eol + 2 + n + 2;
  }
  return r;
}

Reply Http(int port, const std::string& method, const std::string& path, const std::string& body = "") {
  int fd = ConnectTo(port);
  if (fd < 0 || !SendRequest(fd, method, path, body)) {
    if (fd >= 0) ::close(fd);
    return {};
  }
  std::string raw;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) raw.append(buf, n);
  ::close(fd);
  return ParseReply(raw);
}

// --- the server under test -------------------------------------------------------------------

// `corolla serve ARGS --port 0` through the launcher, its stdout and stderr in a file; the port
// from its "ready" line. SIGTERM on destruction if the test did not stop it.
class Server {
 public:
  explicit Server(const std::string& args) {
    log_ = (std::filesystem::temp_directory_path() / ("corolla_serve_dp_" + std::to_string(::getpid()) + "_" +
                                                      std::to_string(++count_) + ".log")).string();
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string cmd = "exec " + std::string(COROLLA_BINARY) + " serve " + args + " --port 0 >" + log_ + " 2>&1";
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    const std::regex ready("ready: http://127\\.0\\.0\\.1:([0-9]+)/v1");
    for (auto deadline = Clock::now() + std::chrono::seconds(60); Clock::now() < deadline && port_ == 0;) {
      std::smatch m;
      const std::string text = Log();
      if (std::regex_search(text, m, ready)) port_ = std::stoi(m[1]);
      int status = 0;
      if (port_ == 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~Server() {
    if (pid_ > 0) Stop();
    std::filesystem::remove(log_);
  }
  int port() const { return port_; }
  std::string Log() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // SIGTERM to the launcher; its exit code (-1: still running after 20 s, then killed).
  int Stop() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    for (auto deadline = Clock::now() + std::chrono::seconds(20); Clock::now() < deadline;) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return -1;
  }

 private:
  static inline int count_ = 0;
  std::string log_;
  pid_t pid_ = -1;
  int port_ = 0;
};

std::string IdList(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

// A metric's value from /metrics: the first line "corolla:NAME... value" (NAME may end with
// labels); -1 if none.
double Metric(int port, const std::string& name) {
  std::istringstream in(Http(port, "GET", "/metrics").body);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("corolla:" + name, 0) == 0) return std::stod(line.substr(line.rfind(' ') + 1));
  return -1;
}

const char* kMoeFixture = "--device cpu --threads 1 --model tests/data/models/qwen3-moe";

// `extra_flags`: more serve flags (the fixed-capacity exchange of decode rounds).
void CompletionsEqualOneProcessAndSurviveACancel(const std::string& extra_flags) {
  // Prompts of 1 to 40 tokens, each with its own max_tokens; #5 is also streamed.
  std::vector<std::vector<int32_t>> prompts = {{7}, {1, 2, 3}, {17, 300, 42, 99, 5, 6, 8}, {}, {}};
  for (int i = 0; i < 20; ++i) prompts[3].push_back((i * 37 + 11) % 1024);
  for (int i = 0; i < 40; ++i) prompts[4].push_back((i * 53 + 3) % 1024);
  const std::vector<int> max_tokens = {12, 5, 9, 12, 3};
  std::string all_prompts;
  for (const auto& p : prompts) all_prompts += (all_prompts.empty() ? "" : ";") + IdList(p);
  auto [gen_ok, gen_out] = RunCorolla(std::string("generate ") + kMoeFixture + " --prompt-ids '" + all_prompts +
                                          "' --max-tokens 12 --temperature 0 --ignore-eos",
                                      /*with_stderr=*/false);
  ASSERT_TRUE(gen_ok) << gen_out;
  std::vector<std::vector<int32_t>> expected;
  std::istringstream lines(gen_out);
  for (std::string line; std::getline(lines, line);) {
    std::vector<int32_t> ids;
    std::stringstream ss(line);
    for (std::string id; std::getline(ss, id, ',');) ids.push_back(std::stoi(id));
    expected.push_back(ids);
  }
  ASSERT_EQ(expected.size(), prompts.size()) << gen_out;

  Server server(std::string(kMoeFixture) + " --dp 2 --ep 2 --max-model-len 2048" + extra_flags);
  ASSERT_GT(server.port(), 0) << server.Log();
  const int port = server.port();
  auto body = [&](size_t i, int n, bool stream) {
    return json{{"prompt", prompts[i]}, {"max_tokens", n}, {"temperature", 0}, {"ignore_eos", true}, {"stream", stream}}.dump();
  };

  // One stream to cancel: it asks for far more tokens than the others take, and its client
  // hangs up after the first chunk.
  std::promise<std::string> cancelled_first_chunk;
  std::thread cancelled([&] {
    int fd = ConnectTo(port);
    std::string got;
    if (fd >= 0 && SendRequest(fd, "POST", "/v1/completions", body(1, 2000, true))) {
      char buf[4096];
      for (ssize_t n; got.find("data: ") == std::string::npos && (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) got.append(buf, n);
    }
    if (fd >= 0) ::close(fd);
    cancelled_first_chunk.set_value(got);
  });
  std::vector<std::future<Reply>> replies;
  for (size_t i = 0; i < prompts.size(); ++i)
    replies.push_back(std::async(std::launch::async, [&, i] { return Http(port, "POST", "/v1/completions", body(i, max_tokens[i], false)); }));
  std::future<Reply> streamed =
      std::async(std::launch::async, [&] { return Http(port, "POST", "/v1/completions", body(4, 12, true)); });

  for (size_t i = 0; i < prompts.size(); ++i) {
    Reply r = replies[i].get();
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = r.Json();
    const std::vector<int32_t> want(expected[i].begin(), expected[i].begin() + max_tokens[i]);
    EXPECT_EQ(j["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want) << "prompt " << i;
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(j["usage"]["prompt_tokens"], prompts[i].size());
    EXPECT_EQ(j["usage"]["completion_tokens"], max_tokens[i]);
  }
  Reply s = streamed.get();
  ASSERT_EQ(s.status, 200) << s.body;
  std::vector<int32_t> streamed_ids;
  std::string finish;
  for (const json& e : s.Events()) {
    const json& c = e["choices"][0];
    if (c.contains("token_ids")) for (int32_t id : c["token_ids"]) streamed_ids.push_back(id);
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(streamed_ids, expected[4]);
  EXPECT_EQ(finish, "length");

  std::future<std::string> first_chunk = cancelled_first_chunk.get_future();
  const std::future_status first = first_chunk.wait_for(std::chrono::seconds(30));
  cancelled.join();
  const std::string cancelled_first_chunk_text = first == std::future_status::ready ? first_chunk.get() : "";
  ASSERT_EQ(first, std::future_status::ready);
  EXPECT_NE(cancelled_first_chunk_text.find("data: {"), std::string::npos) << cancelled_first_chunk_text;
  // The cancelled request ends early and frees its blocks on its rank.
  bool idle = false;
  for (auto deadline = Clock::now() + std::chrono::seconds(20); Clock::now() < deadline && !idle;) {
    idle = Metric(port, "num_requests_running{") == 0 && Metric(port, "num_requests_waiting{") == 0 &&
           Metric(port, "kv_cache_usage_perc{") == 0;
    if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(idle) << "the cancelled request still runs or holds blocks";
  EXPECT_EQ(Metric(port, "request_success_total{model_name=\"qwen3-moe\",finished_reason=\"abort\"}"), 1);
  EXPECT_LT(Metric(port, "generation_tokens_total{"), 2000) << "the cancelled request ran to its end";

  // Still serving; a prompt that cannot fit gets one process's error.
  Reply after = Http(port, "POST", "/v1/completions", body(2, 9, false));
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.Json()["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
            std::vector<int32_t>(expected[2].begin(), expected[2].begin() + 9));
  Reply too_long = Http(port, "POST", "/v1/completions",
                        json{{"prompt", std::vector<int32_t>(2048, 5)}, {"max_tokens", 4}}.dump());
  EXPECT_EQ(too_long.status, 400) << too_long.body;
  EXPECT_EQ(too_long.Json()["error"]["code"], "context_length_exceeded") << too_long.body;

  EXPECT_EQ(server.Stop(), 0) << server.Log();
  // Both ranks served: 8 requests, each to the least loaded rank (ties to rank 0).
  std::smatch counts;
  const std::string log = server.Log();
  ASSERT_TRUE(std::regex_search(log, counts, std::regex("requests per rank: ([0-9]+), ([0-9]+)"))) << log;
  EXPECT_GT(std::stoi(counts[1]), 0);
  EXPECT_GT(std::stoi(counts[2]), 0);
  EXPECT_EQ(std::stoi(counts[1]) + std::stoi(counts[2]), 8);  // the too long prompt never left rank 0
  std::smatch rounds;
  ASSERT_TRUE(std::regex_search(log, rounds, std::regex("fixed-capacity rounds: ([0-9]+) of ([0-9]+)"))) << log;
  if (extra_flags.find("--ep-capacity 16") != std::string::npos) {
    EXPECT_GT(std::stoi(rounds[1]), 0) << "no decode round took the fixed-capacity exchange";
    EXPECT_LT(std::stoi(rounds[1]), std::stoi(rounds[2])) << "no prefill round took the sized exchange";
  } else {
    EXPECT_EQ(std::stoi(rounds[1]), 0);
  }
}

TEST(ServeDataParallel, CompletionsEqualOneProcessAndSurviveACancel) { CompletionsEqualOneProcessAndSurviveACancel(""); }

// Decode rounds (every rank at most 16 tokens) through the fixed-capacity exchange, prefill
// rounds through the sized one, both over the same ranks' collectives: a round in which the ranks
// disagreed would hang or fail. (The CPU captures no graphs; CUDA adds them to the same rounds.)
TEST(ServeDataParallel, FixedCapacityDecodeRoundsEqualOneProcess) {
  CompletionsEqualOneProcessAndSurviveACancel(" --ep-capacity 16");
}

// The built-in demo model (Qwen3-MoE, 8 experts: 4 per rank) through its tokenizer and chat
// template: text completions and a chat equal one `corolla generate` process.
TEST(ServeDataParallel, DemoModelTextEqualsOneProcess) {
  const std::vector<std::string> prompts = {"The capital of France is", "Once upon a time", "1, 2, 3,"};
  std::vector<std::string> expected;
  for (const std::string& p : prompts) {
    auto [ok, out] = RunCorolla("generate --device cpu --threads 1 --prompt '" + p + "' --max-tokens 16 --temperature 0 --json",
                                /*with_stderr=*/false);
    ASSERT_TRUE(ok) << out;
    expected.push_back(json::parse(out)["text"].get<std::string>());
  }
  auto [chat_ok, chat_out] = RunCorolla("generate --device cpu --threads 1 --chat 'Hello!' --max-tokens 16 --temperature 0 --json",
                                        /*with_stderr=*/false);
  ASSERT_TRUE(chat_ok) << chat_out;

  Server server("--device cpu --threads 1 --dp 2 --ep 2");
  ASSERT_GT(server.port(), 0) << server.Log();
  std::vector<std::future<Reply>> replies;
  for (const std::string& p : prompts)
    replies.push_back(std::async(std::launch::async, [&, p] {
      return Http(server.port(), "POST", "/v1/completions", json{{"prompt", p}, {"max_tokens", 16}, {"temperature", 0}}.dump());
    }));
  Reply chat = Http(server.port(), "POST", "/v1/chat/completions",
                    json{{"messages", {{{"role", "user"}, {"content", "Hello!"}}}}, {"max_tokens", 16}, {"temperature", 0}}.dump());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Reply r = replies[i].get();
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.Json()["choices"][0]["text"], expected[i]) << prompts[i];
  }
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(chat.Json()["choices"][0]["message"]["content"], json::parse(chat_out)["text"]);
  EXPECT_EQ(server.Stop(), 0) << server.Log();
}

}  // namespace
}  // namespace corolla
