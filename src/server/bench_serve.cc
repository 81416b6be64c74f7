#include "server/bench_serve.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <thread>
#include <unordered_map>

#include <boost/asio.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace corolla::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Send times in seconds from the start: all 0 without a rate, else a Poisson process.
std::vector<double> ArrivalTimes(const BenchServeOptions& o) {
  std::vector<double> t(std::max(0, o.num_prompts), 0.0);
  if (o.request_rate <= 0) return t;
  std::mt19937_64 rng(o.seed ^ 0x5bd1e995u);
  std::exponential_distribution<double> gap(o.request_rate);
  double now = 0;
  for (double& x : t) {
    x = now;
    now += gap(rng);
  }
  return t;
}

LatencySummary Summary(const std::vector<double>& v) {
  LatencySummary s;
  if (v.empty()) return s;
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / v.size();
  s.p50 = Percentile(v, 50);
  s.p90 = Percentile(v, 90);
  s.p99 = Percentile(v, 99);
  s.max = *std::max_element(v.begin(), v.end());
  return s;
}

Status ValidateOptions(const BenchServeOptions& o) {
  if (o.num_prompts <= 0) return InvalidArgument("--num-prompts must be positive");
  if (o.input_len <= 0 || o.output_len <= 0) return InvalidArgument("--input-len and --output-len must be positive");
  if (o.concurrency < 0 || o.request_rate < 0) return InvalidArgument("--concurrency and --request-rate must not be negative");
  if (!(o.temperature >= 0)) return InvalidArgument("--temperature must not be negative");
  if (o.top_k < 0) return InvalidArgument("--top-k must not be negative (0: off)");
  if (!(o.top_p > 0 && o.top_p <= 1)) return InvalidArgument("--top-p must be in (0, 1]");
  if (!(o.min_p >= 0 && o.min_p <= 1)) return InvalidArgument("--min-p must be in [0, 1]");
  return Status::Ok();
}

std::string SamplingText(const BenchServeOptions& o) {
  if (!(o.temperature > 0)) return "greedy";
  char b[160];
  std::snprintf(b, sizeof(b), "temperature %g, top_k %d, top_p %g, min_p %g", o.temperature, o.top_k, o.top_p,
                o.min_p);
  return b;
}

// --- the HTTP client ----------------------------------------------------------------------

struct Url {
  std::string host, port, base;  // base: the path before /v1, without a trailing '/'
};

Result<Url> ParseUrl(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) return InvalidArgument("--url must start with http:// (got '" + url + "')");
  std::string rest = url.substr(scheme.size());
  size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  Url u;
  u.base = slash == std::string::npos ? "" : rest.substr(slash);
  while (!u.base.empty() && u.base.back() == '/') u.base.pop_back();
  for (const char* suffix : {"/v1/completions", "/v1"}) {
    std::string s = suffix;
    if (u.base.size() >= s.size() && u.base.compare(u.base.size() - s.size(), s.size(), s) == 0) {
      u.base.resize(u.base.size() - s.size());
      break;
    }
  }
  size_t colon = authority.rfind(':');
  if (colon == std::string::npos || colon + 1 == authority.size()) {
    u.host = authority;
    u.port = "80";
  } else {
    u.host = authority.substr(0, colon);
    u.port = authority.substr(colon + 1);
  }
  if (u.host.size() > 2 && u.host.front() == '[' && u.host.back() == ']') u.host = u.host.substr(1, u.host.size() - 2);
  if (u.host.empty()) return InvalidArgument("--url has no host: '" + url + "'");
  return u;
}

// GET base/v1/models, blocking: the served model's card.
Result<json> FetchModelCard(const Url& url, const tcp::resolver::results_type& endpoints) {
  try {
    net::io_context ioc;
    beast::tcp_stream stream(ioc);
    stream.expires_after(std::chrono::seconds(30));
    stream.connect(endpoints);
    http::request<http::empty_body> req(http::verb::get, url.base + "/v1/models", 11);
    req.set(http::field::host, url.host);
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    http::read(stream, buffer, res);
    json j = json::parse(res.body(), nullptr, false);
    if (res.result_int() != 200 || !j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
        !j["data"][0].is_object() || !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
      return Unsupported("GET " + url.base + "/v1/models answered " + std::to_string(res.result_int()) + " without a model: " +
                         res.body().substr(0, 200));
    return j["data"][0];
  } catch (const std::exception& e) {
    return NotFound("cannot reach http://" + url.host + ":" + url.port + ": " + e.what());
  }
}

// Server-sent events of one completion stream, fed as the bytes arrive.
class SseReader {
 public:
  SseReader(BenchRequestResult* result, Clock::time_point sent) : result_(result), sent_(sent) {}

  void Feed(std::string_view bytes, Clock::time_point now) {
    pending_.append(bytes.data(), bytes.size());
    size_t end;
    while ((end = pending_.find("\n\n")) != std::string::npos) {
      std::string event = pending_.substr(0, end);
      pending_.erase(0, end + 2);
      OnEvent(event, now);
    }
  }
  bool done() const { return done_; }
  bool saw_usage() const { return saw_usage_; }
  int num_token_chunks() const { return num_token_chunks_; }
  const std::string& error() const { return error_; }

 private:
  void OnEvent(const std::string& event, Clock::time_point now) {
    size_t pos = 0;
    while (pos < event.size()) {
      size_t eol = event.find('\n', pos);
      std::string line = event.substr(pos, eol == std::string::npos ? std::string::npos : eol - pos);
      pos = eol == std::string::npos ? event.size() : eol + 1;
      if (line.rfind("data:", 0) != 0) continue;
      std::string data = line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
      if (data == "[DONE]") {
        done_ = true;
        continue;
      }
      json j = json::parse(data, nullptr, false);
      if (!j.is_object()) {
        if (error_.empty()) error_ = "unparseable event: " + data.substr(0, 200);
        continue;
      }
      if (j.contains("error")) {
        if (error_.empty()) error_ = "stream error: " + j["error"].dump().substr(0, 300);
        continue;
      }
      if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
        saw_usage_ = true;
        result_->prompt_tokens = u->value("prompt_tokens", 0);
        result_->output_tokens = u->value("completion_tokens", 0);
      }
      auto c = j.find("choices");
      if (c == j.end() || !c->is_array() || c->empty()) continue;
      const json& choice = (*c)[0];
      bool has_text = choice.contains("text") && choice["text"].is_string() && !choice["text"].get_ref<const std::string&>().empty();
      bool finishing = choice.contains("finish_reason") && !choice["finish_reason"].is_null();
      // A chunk carrying text, or any chunk before the finishing one, marks a token's arrival
      // (a token whose bytes do not complete a character yet streams with the next one).
      if (!has_text && finishing) continue;
      double t = Seconds(now - sent_);
      if (num_token_chunks_ == 0) {
        result_->ttft = t;
      } else {
        result_->itl.push_back(t - last_);
      }
      last_ = t;
      ++num_token_chunks_;
    }
  }

  BenchRequestResult* result_;
  Clock::time_point sent_;
  std::string pending_;
  std::string error_;
  bool done_ = false, saw_usage_ = false;
  int num_token_chunks_ = 0;
  double last_ = 0;
};

struct HttpRun {
  const BenchServeOptions& options;
  Url url;
  tcp::resolver::results_type endpoints;
  std::string model;
  std::vector<std::string> bodies;
  std::vector<double> arrivals;
  std::vector<BenchRequestResult> results;
  int in_flight = 0;
  int num_finished = 0;
  std::unique_ptr<net::steady_timer> slot_freed;  // cancelled whenever a request ends
};

net::awaitable<void> SendOne(HttpRun& run, int idx) {
  BenchRequestResult& result = run.results[idx];
  beast::tcp_stream stream(co_await net::this_coro::executor);
  stream.expires_after(std::chrono::milliseconds(static_cast<int64_t>(run.options.timeout_s * 1000)));
  Clock::time_point sent = Clock::now();
  SseReader sse(&result, sent);
  try {
    co_await stream.async_connect(run.endpoints, net::use_awaitable);
    stream.socket().set_option(tcp::no_delay(true));
    http::request<http::string_body> req(http::verb::post, run.url.base + "/v1/completions", 11);
    req.set(http::field::host, run.url.host);
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "text/event-stream");
    req.body() = run.bodies[idx];
    req.prepare_payload();
    co_await http::async_write(stream, req, net::use_awaitable);

    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    auto on_chunk = [&](std::uint64_t, beast::string_view body, beast::error_code&) -> std::size_t {
      sse.Feed(std::string_view(body.data(), body.size()), Clock::now());
      return body.size();
    };
    parser.on_chunk_body(on_chunk);
    co_await http::async_read(stream, buffer, parser, net::use_awaitable);
    result.latency = Seconds(Clock::now() - sent);
    int status = parser.get().result_int();
    if (status != 200) {
      result.error = "HTTP " + std::to_string(status) + ": " + parser.get().body().substr(0, 300);
    } else if (!sse.error().empty()) {
      result.error = sse.error();
    } else if (!sse.done()) {
      result.error = "the stream ended without [DONE]";
    } else {
      result.ok = true;
      if (!sse.saw_usage()) {
        result.prompt_tokens = run.options.input_len;
        result.output_tokens = sse.num_token_chunks();
      }
    }
  } catch (const boost::system::system_error& e) {
    result.error = e.code() == beast::error::timeout ? "timed out" : e.what();
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
}

net::awaitable<void> Dispatch(HttpRun& run, Clock::time_point start) {
  auto ex = co_await net::this_coro::executor;
  net::steady_timer arrival(ex);
  const int n = static_cast<int>(run.bodies.size());
  for (int i = 0; i < n; ++i) {
    arrival.expires_at(start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(run.arrivals[i])));
    co_await arrival.async_wait(net::use_awaitable);
    while (run.options.concurrency > 0 && run.in_flight >= run.options.concurrency) {
      run.slot_freed->expires_at(Clock::time_point::max());
      beast::error_code ec;
      co_await run.slot_freed->async_wait(net::redirect_error(net::use_awaitable, ec));
    }
    ++run.in_flight;
    net::co_spawn(ex, SendOne(run, i), [&run, n, i](std::exception_ptr e) {
      if (e && run.results[i].error.empty()) {
        run.results[i].ok = false;
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          run.results[i].error = x.what();
        } catch (...) {
          run.results[i].error = "unknown error";
        }
      }
      --run.in_flight;
      ++run.num_finished;
      run.slot_freed->cancel();
      if (run.options.on_progress) run.options.on_progress(run.num_finished, n);
    });
  }
}

json CompletionBody(const BenchServeOptions& o, const std::string& model, const std::vector<int32_t>& prompt,
                    int index) {
  json body = {{"model", model},           {"prompt", prompt},
               {"max_tokens", o.output_len}, {"ignore_eos", true},
               {"temperature", o.temperature},
               {"stream", true},           {"stream_options", {{"include_usage", true}}}};
  if (o.temperature > 0) {
    body["top_k"] = o.top_k;
    body["top_p"] = o.top_p;
    body["min_p"] = o.min_p;
    body["seed"] = SamplingSeed(o.seed, index);
  }
  return body;
}

}  // namespace

uint64_t SamplingSeed(uint64_t seed, int index) {
  return seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(index);
}

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  double rank = std::clamp(q, 0.0, 100.0) / 100.0 * (values.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(rank));
  size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - lo);
}

std::vector<std::vector<int32_t>> RandomPrompts(const BenchServeOptions& o, int vocab_size) {
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> id(0, std::max(1, vocab_size) - 1);
  std::vector<std::vector<int32_t>> prompts(std::max(0, o.num_prompts));
  for (auto& p : prompts) {
    p.resize(std::max(0, o.input_len));
    for (auto& t : p) t = id(rng);
  }
  return prompts;
}

StepSummaries SummarizeSteps(const std::vector<StepRecord>& records) {
  StepSummaries out;
  for (StepSummary* kind : {&out.decode, &out.mixed}) {
    const bool mixed = kind == &out.mixed;
    std::vector<double> times;
    for (const StepRecord& r : records) {
      if ((r.prefill_tokens > 0) != mixed) continue;
      times.push_back(r.seconds);
      kind->graph_steps += r.graph ? 1 : 0;
      kind->mean += r.seconds;
      kind->decode_rows += r.decode_rows;
      kind->prefill_tokens += r.prefill_tokens;
    }
    kind->steps = static_cast<int>(times.size());
    if (times.empty()) continue;
    const double n = static_cast<double>(times.size());
    kind->mean /= n;
    kind->decode_rows /= n;
    kind->prefill_tokens /= n;
    kind->p50 = Percentile(times, 50);
    kind->p90 = Percentile(std::move(times), 90);
  }
  return out;
}

BenchServeReport Summarize(const BenchServeOptions& o, const std::vector<BenchRequestResult>& results, double duration_s) {
  BenchServeReport r;
  r.sampling = SamplingText(o);
  r.num_prompts = o.num_prompts;
  r.concurrency = o.concurrency;
  r.request_rate = o.request_rate;
  r.input_len = o.input_len;
  r.output_len = o.output_len;
  r.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const auto& x : results) {
    if (!x.ok) {
      ++r.num_failed;
      if (r.first_errors.size() < 5) r.first_errors.push_back(x.error);
      continue;
    }
    ++r.num_completed;
    r.total_input_tokens += x.prompt_tokens;
    r.total_output_tokens += x.output_tokens;
    ttft.push_back(x.ttft);
    e2e.push_back(x.latency);
    if (x.output_tokens > 1) tpot.push_back((x.latency - x.ttft) / (x.output_tokens - 1));
    itl.insert(itl.end(), x.itl.begin(), x.itl.end());
  }
  if (duration_s > 0) {
    r.request_throughput = r.num_completed / duration_s;
    r.output_throughput = r.total_output_tokens / duration_s;
    r.total_token_throughput = (r.total_input_tokens + r.total_output_tokens) / duration_s;
  }
  r.ttft = Summary(ttft);
  r.tpot = Summary(tpot);
  r.itl = Summary(itl);
  r.e2e = Summary(e2e);
  return r;
}

std::string BenchServeReport::ToText() const {
  std::string s;
  char line[160];
  auto row = [&](const char* name, const std::string& value) {
    std::snprintf(line, sizeof(line), "%-40s %s\n", name, value.c_str());
    s += line;
  };
  auto num = [](double v, int digits) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.*f", digits, v);
    return std::string(b);
  };
  auto section = [&](const char* title) {
    std::string t = std::string(" ") + title + " ";
    size_t left = t.size() < 50 ? (50 - t.size()) / 2 : 0;
    s += std::string(left, '-') + t + std::string(t.size() + left < 50 ? 50 - t.size() - left : 0, '-') + "\n";
  };
  auto latency = [&](const char* what, const LatencySummary& l) {
    row((std::string("Mean ") + what + " (ms):").c_str(), num(l.mean * 1e3, 2));
    row((std::string("P50 ") + what + " (ms):").c_str(), num(l.p50 * 1e3, 2));
    row((std::string("P90 ") + what + " (ms):").c_str(), num(l.p90 * 1e3, 2));
    row((std::string("P99 ") + what + " (ms):").c_str(), num(l.p99 * 1e3, 2));
    row((std::string("Max ") + what + " (ms):").c_str(), num(l.max * 1e3, 2));
  };
  s += "============ Serving Benchmark Result ============\n";
  row("Target:", target);
  row("Model:", model);
  row("Sampling:", sampling);
  row("Input / output tokens per request:", std::to_string(input_len) + " / " + std::to_string(output_len));
  row("Maximum request concurrency:", concurrency > 0 ? std::to_string(concurrency) : "unlimited");
  row("Request rate configured (req/s):", request_rate > 0 ? num(request_rate, 2) : "inf");
  row("Successful requests:", std::to_string(num_completed));
  row("Failed requests:", std::to_string(num_failed));
  row("Benchmark duration (s):", num(duration_s, 2));
  row("Total input tokens:", std::to_string(total_input_tokens));
  row("Total generated tokens:", std::to_string(total_output_tokens));
  row("Request throughput (req/s):", num(request_throughput, 2));
  row("Output token throughput (tok/s):", num(output_throughput, 2));
  row("Total token throughput (tok/s):", num(total_token_throughput, 2));
  section("Time to First Token");
  latency("TTFT", ttft);
  section("Time per Output Token (excl. 1st token)");
  latency("TPOT", tpot);
  section("Inter-token Latency");
  latency("ITL", itl);
  section("End-to-end Latency");
  latency("E2EL", e2e);
  if (steps) {
    section("Engine Steps");
    auto kind = [&](const char* name, const StepSummary& k) {
      row((std::string(name) + " steps (graphs):").c_str(),
          std::to_string(k.steps) + " (" + std::to_string(k.graph_steps) + ")");
      if (k.steps == 0) return;
      row((std::string(name) + " step mean / p50 / p90 (ms):").c_str(),
          num(k.mean * 1e3, 3) + " / " + num(k.p50 * 1e3, 3) + " / " + num(k.p90 * 1e3, 3));
      row((std::string(name) + " rows / prompt tokens a step:").c_str(),
          num(k.decode_rows, 1) + " / " + num(k.prefill_tokens, 1));
    };
    kind("Decode-only", steps->decode);
    kind("Mixed", steps->mixed);
  }
  s += "==================================================\n";
  for (const auto& e : first_errors) s += "error: " + e + "\n";
  return s;
}

json BenchServeReport::ToJson() const {
  auto lat = [](const LatencySummary& l) {
    return json{{"mean_ms", l.mean * 1e3},
                {"p50_ms", l.p50 * 1e3},
                {"p90_ms", l.p90 * 1e3},
                {"p99_ms", l.p99 * 1e3},
                {"max_ms", l.max * 1e3}};
  };
  json j = {{"target", target},
            {"model", model},
            {"sampling", sampling},
            {"num_prompts", num_prompts},
            {"concurrency", concurrency},
            {"request_rate", request_rate},
            {"input_len", input_len},
            {"output_len", output_len},
            {"completed", num_completed},
            {"failed", num_failed},
            {"errors", first_errors},
            {"total_input_tokens", total_input_tokens},
            {"total_output_tokens", total_output_tokens},
            {"duration_s", duration_s},
            {"request_throughput", request_throughput},
            {"output_throughput", output_throughput},
            {"total_token_throughput", total_token_throughput},
            {"ttft", lat(ttft)},
            {"tpot", lat(tpot)},
            {"itl", lat(itl)},
            {"e2el", lat(e2e)}};
  if (steps) {
    auto kind = [](const StepSummary& k) {
      return json{{"steps", k.steps},
                  {"graph_steps", k.graph_steps},
                  {"mean_ms", k.mean * 1e3},
                  {"p50_ms", k.p50 * 1e3},
                  {"p90_ms", k.p90 * 1e3},
                  {"decode_rows", k.decode_rows},
                  {"prefill_tokens", k.prefill_tokens}};
    };
    j["steps"] = {{"decode", kind(steps->decode)}, {"mixed", kind(steps->mixed)}};
  }
  return j;
}

namespace {

// One timed pass of `options` against a server whose card was read.
BenchServeReport RunHttpOnce(const BenchServeOptions& options, const Url& url, const tcp::resolver::results_type& endpoints,
                             const std::string& model, int vocab_size) {
  net::io_context ioc(1);
  HttpRun run{options, url, endpoints, model, {}, ArrivalTimes(options), {}, 0, 0, nullptr};
  for (const auto& p : RandomPrompts(options, vocab_size))
    run.bodies.push_back(CompletionBody(options, model, p, static_cast<int>(run.bodies.size())).dump());
  run.results.resize(run.bodies.size());
  run.slot_freed = std::make_unique<net::steady_timer>(ioc);
  Clock::time_point start = Clock::now();
  net::co_spawn(ioc, Dispatch(run, start), net::detached);
  ioc.run();
  double duration = Seconds(Clock::now() - start);
  BenchServeReport report = Summarize(options, run.results, duration);
  report.target = options.url;
  report.model = model;
  return report;
}

// The untimed warm-up pass of a run: num_warmup other prompts, as many at once as the run allows.
BenchServeOptions WarmupOptions(const BenchServeOptions& o) {
  BenchServeOptions w = o;
  w.num_prompts = o.num_warmup;
  w.request_rate = 0;
  w.seed = o.seed + 0x9e3779b9u;
  w.on_progress = nullptr;
  return w;
}

}  // namespace

Result<BenchServeReport> RunHttpBench(const BenchServeOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  ASSIGN_OR_RETURN(Url url, ParseUrl(options.url));
  tcp::resolver::results_type endpoints;
  {
    net::io_context ioc(1);
    beast::error_code ec;
    tcp::resolver resolver(ioc);
    endpoints = resolver.resolve(url.host, url.port, ec);
    if (ec) return NotFound("cannot resolve " + url.host + ":" + url.port + ": " + ec.message());
  }
  ASSIGN_OR_RETURN(json card, FetchModelCard(url, endpoints));
  std::string model = options.model.empty() ? card["id"].get<std::string>() : options.model;
  int vocab_size = options.vocab_size;
  if (vocab_size <= 0) vocab_size = card.contains("vocab_size") && card["vocab_size"].is_number_integer() ? card["vocab_size"].get<int>() : 1000;
  if (card.contains("max_model_len") && card["max_model_len"].is_number_integer() &&
      options.input_len + options.output_len > card["max_model_len"].get<int>())
    return InvalidArgument("input + output length (" + std::to_string(options.input_len + options.output_len) +
                           ") exceeds the server's max_model_len (" + std::to_string(card["max_model_len"].get<int>()) + ")");
  if (options.num_warmup > 0) {
    BenchServeReport warmup = RunHttpOnce(WarmupOptions(options), url, endpoints, model, vocab_size);
    if (warmup.num_completed == 0)
      return Unsupported("every warm-up request failed: " + (warmup.first_errors.empty() ? "" : warmup.first_errors[0]));
  }
  return RunHttpOnce(options, url, endpoints, model, vocab_size);
}

namespace {

BenchServeReport RunEngineOnce(Engine& engine, const BenchServeOptions& options) {
  const int n = options.num_prompts;
  std::vector<std::vector<int32_t>> prompts = RandomPrompts(options, options.vocab_size > 0 ? options.vocab_size : 1000);
  std::vector<double> arrivals = ArrivalTimes(options);
  std::vector<BenchRequestResult> results(n);
  std::vector<double> sent(n, 0), last(n, 0);
  std::unordered_map<int64_t, int> index_of_seq;
  int next = 0, num_finished = 0, in_flight = 0;
  Clock::time_point start = Clock::now();
  auto since_start = [&] { return Seconds(Clock::now() - start); };
  engine.TakeStepRecords();  // the warm-up's, if any
  engine.set_record_steps(true);
  auto finish = [&](int idx) {
    ++num_finished;
    if (options.on_progress) options.on_progress(num_finished, n);
  };
  while (num_finished < n) {
    // Admit what has arrived, as the HTTP client would send it.
    double now = since_start();
    while (next < n && arrivals[next] <= now && (options.concurrency <= 0 || in_flight < options.concurrency)) {
      GenerationRequest g;
      g.prompt = prompts[next];
      g.max_tokens = options.output_len;
      g.ignore_eos = true;
      g.sampling.temperature = options.temperature > 0 ? static_cast<float>(options.temperature) : 0.f;
      g.sampling.top_k = options.top_k;
      g.sampling.top_p = static_cast<float>(options.top_p);
      g.sampling.min_p = static_cast<float>(options.min_p);
      g.sampling.seed = SamplingSeed(options.seed, next);
      sent[next] = since_start();
      Result<int64_t> seq = engine.AddRequest(std::move(g));
      if (!seq.ok()) {
        results[next].error = seq.status().ToString();
        finish(next);
      } else {
        index_of_seq[*seq] = next;
        results[next].prompt_tokens = options.input_len;
        ++in_flight;
      }
      ++next;
    }
    if (!engine.HasUnfinished()) {
      if (next < n) std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.0, arrivals[next] - since_start())));
      continue;
    }
    std::vector<StepOutput> outputs = engine.Step();
    double t = since_start();
    for (const StepOutput& o : outputs) {
      auto it = index_of_seq.find(o.seq_id);
      if (it == index_of_seq.end()) continue;
      int idx = it->second;
      BenchRequestResult& r = results[idx];
      if (r.output_tokens == 0) {
        r.ttft = t - sent[idx];
      } else {
        r.itl.push_back(t - last[idx]);
      }
      last[idx] = t;
      ++r.output_tokens;
      if (o.finish_reason != FinishReason::kNone) {
        r.latency = t - sent[idx];
        r.ok = o.finish_reason != FinishReason::kAbort;
        if (!r.ok) r.error = "aborted";
        index_of_seq.erase(it);
        --in_flight;
        finish(idx);
      }
    }
    engine.DiscardFinished();
  }
  BenchServeReport report = Summarize(options, results, since_start());
  report.target = "engine (in-process)";
  engine.set_record_steps(false);
  report.steps = SummarizeSteps(engine.TakeStepRecords());
  return report;
}

}  // namespace

Result<BenchServeReport> RunEngineBench(Engine& engine, const BenchServeOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  if (engine.HasUnfinished()) return InvalidArgument("the engine is busy");
  if (options.num_warmup > 0) RunEngineOnce(engine, WarmupOptions(options));
  return RunEngineOnce(engine, options);
}

}  // namespace corolla::server
