#include "server/server.h"

#include <algorithm>
#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "base/logging.h"
#include "server/openai_protocol.h"
#include "server/stop_strings.h"

namespace corolla::server {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct OpenAiServer::Context {
  ServerOptions options;
  std::atomic<ServedModel*> model{nullptr};  // set once by Attach
  std::unique_ptr<ServedModel> owned;
  std::unique_ptr<Metrics> metrics;          // created by Attach
  std::atomic<uint64_t> next_request{1};
  uint64_t seed_base = std::random_device{}();
};

namespace {

constexpr const char* kJson = "application/json";

void SendError(HttpResponder& r, const ApiError& e) { r.Send(e.status, kJson, e.ToJson()); }

ApiError ErrorOf(int status, std::string message, std::string type, std::string code = "", std::string param = "") {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  e.param = std::move(param);
  return e;
}

int64_t UnixTime() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// JSON has no -inf: report impossible tokens as -9999, as vLLM does.
double FiniteLogprob(float lp) { return std::isfinite(lp) ? lp : -9999.0; }

std::string Sse(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

// One request from submission to its last byte: its n choices, each an engine request of its
// own. Its state is touched by the engine's output thread only (OnOutput runs there, one call at a
// time, for every choice).
class Generation {
 public:
  Generation(OpenAiServer::Context* ctx, ServedModel* m, std::shared_ptr<HttpResponder> responder, bool chat,
             const CompletionParams& p)
      : ctx_(ctx), m_(m), responder_(std::move(responder)), chat_(chat), stream_(p.stream),
        include_usage_(p.include_usage), num_logprobs_(p.num_logprobs), ignore_eos_(p.ignore_eos),
        arrival_(Clock::now()) {
    uint64_t n = ctx->next_request.fetch_add(1);
    char id[48];
    std::snprintf(id, sizeof(id), "%s-%016llx%04llx", chat ? "chatcmpl" : "cmpl",
                  static_cast<unsigned long long>(ctx->seed_base), static_cast<unsigned long long>(n & 0xffff));
    id_ = id;
    created_ = UnixTime();
    for (int i = 0; i < std::max(1, p.n); ++i) {
      auto c = std::make_unique<Choice>(m->tokenizer.get(), p);
      if (!chat && num_logprobs_ >= 0) c->completion_logprobs = {{"tokens", json::array()}, {"token_logprobs", json::array()},
                                                                 {"top_logprobs", json::array()}, {"text_offset", json::array()}};
      if (chat && num_logprobs_ >= 0) c->chat_logprobs = json::array();
      choices_.push_back(std::move(c));
    }
  }

  void set_stop_ids(std::vector<int32_t> ids) { stop_ids_ = std::move(ids); }
  void set_prompt(int num_prompt_tokens, const std::string& echo_text) {
    num_prompt_ = num_prompt_tokens;
    for (auto& c : choices_) {
      c->text = echo_text;  // echo: the prompt leads the returned text
      if (stream_) c->pending_echo = echo_text;
    }
  }

  // New tokens of choice `index`; false ends that engine request.
  bool OnOutput(int index, const RequestOutput& out) {
    Choice& c = *choices_[index];
    if (c.done || aborted_) return false;
    Clock::time_point now = Clock::now();
    std::string emitted;
    bool stopped = false;
    json chunk_logprobs = json::array();
    std::vector<int32_t> new_ids;  // without a tokenizer, streamed as "token_ids"
    for (size_t i = 0; i < out.tokens.size() && !stopped; ++i) {
      int32_t token = out.tokens[i];
      if (num_generated_ == 0) {
        ctx_->metrics->ObserveTimeToFirstToken(std::chrono::duration<double>(now - arrival_).count());
      } else if (c.num_generated > 0) {
        ctx_->metrics->ObserveInterTokenLatency(std::chrono::duration<double>(now - c.last_token).count());
      }
      c.last_token = now;
      ++c.num_generated;
      ++num_generated_;
      bool eos_stop = out.finish_reason == FinishReason::kStop && i + 1 == out.tokens.size() && !ignore_eos_ &&
                      std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end();
      std::string piece;
      if (!eos_stop && c.detok) {
        Result<std::string> r = c.detok->Push(token);
        if (r.ok()) piece = std::move(r).value();
      }
      if (!c.detok) new_ids.push_back(token);
      std::string visible = c.stops.Push(piece, &stopped);
      if (num_logprobs_ >= 0 && i < out.logprobs.size()) {
        AddLogprob(c, token, out.logprobs[i], i < out.top_logprobs.size() ? out.top_logprobs[i] : std::vector<TokenLogprob>{},
                   c.text.size() + emitted.size(), &chunk_logprobs);
      }
      emitted += visible;
    }
    const char* reason = nullptr;
    if (stopped) {
      reason = "stop";
    } else if (out.finish_reason != FinishReason::kNone) {
      bool unused;
      emitted += c.stops.Push(c.detok ? c.detok->Flush() : std::string(), &unused);
      if (unused) {
        reason = "stop";
      } else {
        emitted += c.stops.Flush();
        reason = out.finish_reason == FinishReason::kLength ? "length"
                 : out.finish_reason == FinishReason::kStop ? "stop"
                                                            : nullptr;
      }
    }
    if (out.finish_reason == FinishReason::kAbort && !stopped) {
      Abort();
      return false;
    }
    c.text += emitted;
    c.token_ids.insert(c.token_ids.end(), new_ids.begin(), new_ids.end());
    if (stream_ && (!emitted.empty() || !new_ids.empty() || !chunk_logprobs.empty() || !c.sent_first))
      SendChunk(index, emitted, chunk_logprobs, nullptr, !c.detok ? &new_ids : nullptr);
    if (reason) {
      FinishChoice(index, reason);
      return false;
    }
    return true;
  }

 private:
  struct Choice {
    Choice(const Tokenizer* tokenizer, const CompletionParams& p) : stops(p.stop) {
      if (tokenizer) detok.emplace(*tokenizer, p.skip_special_tokens);
    }
    std::optional<StreamingDetokenizer> detok;  // none without a tokenizer: token ids only
    std::vector<int32_t> token_ids;             // without a tokenizer: what was generated
    StopStringMatcher stops;
    std::string text, pending_echo;
    json chat_logprobs, completion_logprobs;
    Clock::time_point last_token;
    int num_generated = 0;
    bool sent_first = false, done = false;
    const char* finish_reason = nullptr;
  };

  std::string TokenText(int32_t token) const {
    if (!m_->tokenizer) return "token_id:" + std::to_string(token);  // vLLM's spelling
    Result<std::string> t = m_->tokenizer->Decode(std::span<const int32_t>(&token, 1), false);
    return t.ok() ? *t : "";
  }

  void AddLogprob(Choice& c, int32_t token, float lp, const std::vector<TokenLogprob>& top, size_t offset, json* chunk) {
    if (chat_) {
      auto entry = [&](int32_t id, float v) {
        std::string s = TokenText(id);
        return json{{"token", s}, {"logprob", FiniteLogprob(v)}, {"bytes", std::vector<uint8_t>(s.begin(), s.end())}};
      };
      json e = entry(token, lp);
      json tops = json::array();
      for (const auto& t : top) tops.push_back(entry(t.token, t.logprob));
      e["top_logprobs"] = tops;
      chunk->push_back(e);
      c.chat_logprobs.push_back(e);
    } else {
      json tops = json::object();
      for (const auto& t : top) tops[TokenText(t.token)] = FiniteLogprob(t.logprob);
      json e = {{"token", TokenText(token)}, {"logprob", FiniteLogprob(lp)}, {"top", tops}, {"offset", offset}};
      chunk->push_back(e);
      c.completion_logprobs["tokens"].push_back(e["token"]);
      c.completion_logprobs["token_logprobs"].push_back(e["logprob"]);
      c.completion_logprobs["top_logprobs"].push_back(tops);
      c.completion_logprobs["text_offset"].push_back(offset);
    }
  }

  json LogprobsOf(const json& entries) const {
    if (num_logprobs_ < 0) return nullptr;
    if (chat_) return json{{"content", entries}};
    json l = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()}, {"text_offset", json::array()}};
    for (const auto& e : entries) {
      l["tokens"].push_back(e["token"]);
      l["token_logprobs"].push_back(e["logprob"]);
      l["top_logprobs"].push_back(e["top"]);
      l["text_offset"].push_back(e["offset"]);
    }
    return l;
  }

  json Usage() const {
    return {{"prompt_tokens", num_prompt_}, {"completion_tokens", num_generated_}, {"total_tokens", num_prompt_ + num_generated_}};
  }

  json ChunkBase() const {
    json c = {{"id", id_}, {"object", chat_ ? "chat.completion.chunk" : "text_completion"}, {"created", created_}, {"model", m_->name}};
    if (include_usage_) c["usage"] = nullptr;
    return c;
  }

  // token_ids: without a tokenizer, the chunk's tokens (completions).
  void SendChunk(int index, const std::string& text, const json& logprob_entries, const char* reason,
                 const std::vector<int32_t>* token_ids = nullptr) {
    Choice& c = *choices_[index];
    json choice = {{"index", index}, {"logprobs", logprob_entries.empty() ? json(nullptr) : LogprobsOf(logprob_entries)},
                   {"finish_reason", reason ? json(reason) : json(nullptr)}};
    if (chat_) {
      json delta = json::object();
      if (!c.sent_first) delta["role"] = "assistant";
      if (!text.empty() || !c.sent_first) delta["content"] = text;
      choice["delta"] = delta;
    } else {
      choice["text"] = c.pending_echo + text;
      c.pending_echo.clear();
      if (token_ids) choice["token_ids"] = *token_ids;
    }
    // The stream starts with the first chunk, so every write of this request comes from the
    // engine's output thread, in order.
    if (!stream_started_) responder_->StartStream(200, "text/event-stream");
    stream_started_ = true;
    c.sent_first = true;
    json chunk = ChunkBase();
    chunk["choices"] = json::array({choice});
    responder_->Write(Sse(chunk));
  }

  void FinishChoice(int index, const char* reason) {
    Choice& c = *choices_[index];
    c.done = true;
    c.finish_reason = reason;
    if (stream_) SendChunk(index, "", json::array(), reason);
    if (++num_done_ < static_cast<int>(choices_.size())) return;

    ctx_->metrics->RequestFinished(reason);
    ctx_->metrics->AddTokens(num_prompt_, num_generated_);
    ctx_->metrics->ObserveEndToEnd(std::chrono::duration<double>(Clock::now() - arrival_).count());
    if (stream_) {
      if (include_usage_) {
        json u = ChunkBase();
        u["choices"] = json::array();
        u["usage"] = Usage();
        responder_->Write(Sse(u));
      }
      responder_->Write("data: [DONE]\n\n");
      responder_->End();
      return;
    }
    json choices = json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const Choice& ch = *choices_[i];
      json choice = {{"index", i}, {"finish_reason", ch.finish_reason}};
      if (chat_) {
        choice["message"] = {{"role", "assistant"}, {"content", ch.text}};
        choice["logprobs"] = num_logprobs_ >= 0 ? json{{"content", ch.chat_logprobs}} : json(nullptr);
      } else {
        choice["text"] = ch.text;
        if (!ch.detok) choice["token_ids"] = ch.token_ids;
        choice["logprobs"] = num_logprobs_ >= 0 ? ch.completion_logprobs : json(nullptr);
      }
      choices.push_back(std::move(choice));
    }
    json body = {{"id", id_}, {"object", chat_ ? "chat.completion" : "text_completion"}, {"created", created_},
                 {"model", m_->name}, {"choices", choices}, {"usage", Usage()}};
    responder_->Send(200, kJson, body.dump(-1, ' ', false, json::error_handler_t::replace));
  }

  // Any choice aborted (client gone, shutdown) ends the whole response; the other choices end
  // at their next output.
  void Abort() {
    aborted_ = true;
    ctx_->metrics->RequestFinished("abort");
    ctx_->metrics->AddTokens(num_prompt_, num_generated_);
    ApiError e = ErrorOf(503, "the request was aborted (cancelled or the server is shutting down)", "server_error", "aborted");
    if (stream_) {
      if (!stream_started_) responder_->StartStream(200, "text/event-stream");
      stream_started_ = true;
      responder_->Write("data: " + e.ToJson() + "\n\n");
      responder_->Write("data: [DONE]\n\n");
      responder_->End();
    } else {
      SendError(*responder_, e);
    }
  }

  OpenAiServer::Context* ctx_;
  ServedModel* m_;
  std::shared_ptr<HttpResponder> responder_;
  const bool chat_, stream_, include_usage_;
  const int num_logprobs_;
  const bool ignore_eos_;
  std::vector<int32_t> stop_ids_;
  std::vector<std::unique_ptr<Choice>> choices_;
  const Clock::time_point arrival_;
  std::string id_;
  int64_t created_ = 0;
  int num_prompt_ = 0;
  int num_generated_ = 0;  // over all choices
  int num_done_ = 0;
  bool aborted_ = false, stream_started_ = false;
};

std::string StripQuery(const std::string& target) { return target.substr(0, target.find('?')); }

}  // namespace

Result<std::unique_ptr<ServedModel>> MakeServedModel(const std::string& dir, std::unique_ptr<Backend> backend,
                                                     std::unique_ptr<Model> model, const EngineOptions& engine_options,
                                                     const AsyncEngineOptions& async_options, std::string name) {
  EngineFactory make_engine = [&](Model& served_model, Backend& served_backend) -> Result<std::unique_ptr<ServingEngine>> {
    ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(served_model, served_backend, engine_options));
    return std::unique_ptr<ServingEngine>(new AsyncEngine(std::move(engine), async_options));
  };
  return MakeServedModel(dir, std::move(backend), std::move(model), make_engine, std::move(name));
}

Result<std::unique_ptr<ServedModel>> MakeServedModel(const std::string& dir, std::unique_ptr<Backend> backend,
                                                     std::unique_ptr<Model> model, const EngineFactory& make_engine,
                                                     std::string name) {
  auto m = std::make_unique<ServedModel>();
  if (name.empty() && !dir.empty()) {
    std::string trimmed = dir;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    name = trimmed.substr(trimmed.find_last_of('/') + 1);
  }
  m->name = name.empty() ? "model" : name;
  // A checkpoint without a tokenizer (the test fixtures) is served like random weights.
  const bool has_tokenizer = !dir.empty() && std::filesystem::exists(dir + "/tokenizer.json");
  if (!has_tokenizer) {
    LOG(WARNING) << "no tokenizer: /v1/completions takes token-id prompts and returns token_ids; chat, text prompts, "
                    "/tokenize and /detokenize answer 400";
  }
  if (dir.empty()) {
    m->generation.eos_token_ids = model->config().eos_token_ids;
  } else {
    if (has_tokenizer) {
      ASSIGN_OR_RETURN(m->tokenizer, Tokenizer::LoadFromDir(dir));
      Result<ChatTemplate> chat_template = ChatTemplate::LoadFromDir(dir);
      if (chat_template.ok()) {
        m->chat_template = std::move(chat_template).value();
      } else {
        LOG(WARNING) << "no chat template (" << chat_template.status().message() << "); /v1/chat/completions will fail";
      }
    }
    ASSIGN_OR_RETURN(m->generation, LoadGenerationConfig(dir, model->config()));
  }
  ASSIGN_OR_RETURN(m->engine, make_engine(*model, *backend));
  m->backend = std::move(backend);
  m->model = std::move(model);
  return m;
}

OpenAiServer::OpenAiServer(ServerOptions options) : ctx_(std::make_shared<Context>()) { ctx_->options = std::move(options); }

OpenAiServer::~OpenAiServer() { Shutdown(std::chrono::milliseconds(0)); }

Result<std::unique_ptr<OpenAiServer>> OpenAiServer::Start(ServerOptions options) {
  std::unique_ptr<OpenAiServer> server(new OpenAiServer(options));
  OpenAiServer* self = server.get();
  ASSIGN_OR_RETURN(server->http_, HttpServer::Start(options.http, [self](HttpRequest req, std::shared_ptr<HttpResponder> r) {
                     self->Handle(std::move(req), std::move(r));
                   }));
  return server;
}

void OpenAiServer::Attach(std::unique_ptr<ServedModel> model) {
  ctx_->metrics = std::make_unique<Metrics>(model->name);
  ctx_->owned = std::move(model);
  ctx_->model.store(ctx_->owned.get());
}

const std::string& OpenAiServer::model_name() const {
  static const std::string kNone;
  ServedModel* m = ctx_->model.load();
  return m ? m->name : kNone;
}

std::optional<EngineStats> OpenAiServer::Stats() const {
  ServedModel* m = ctx_->model.load();
  if (!m) return std::nullopt;
  return m->engine->Stats();
}

void OpenAiServer::Shutdown(std::chrono::milliseconds drain) {
  if (shut_down_.exchange(true)) return;
  http_->StopAccepting();
  if (ServedModel* m = ctx_->model.load()) m->engine->Shutdown(drain);
  // Let the last responses reach their sockets before the connections close.
  for (int i = 0; i < 50 && http_->num_open_connections() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  http_->Stop();
}

namespace {

std::optional<ApiError> CheckModelName(const CompletionParams& p, const ServedModel& m) {
  if (!p.model.empty() && p.model != m.name)
    return ErrorOf(404, "The model `" + p.model + "` does not exist.", "invalid_request_error", "model_not_found", "model");
  return std::nullopt;
}

// What endpoints that need text answer when the model was loaded without a tokenizer.
ApiError NoTokenizer(const std::string& param = "") {
  return ErrorOf(400, "this model has no tokenizer (random weights without a checkpoint): send prompts to /v1/completions as token ids",
                 "invalid_request_error", "no_tokenizer", param);
}

Result<std::vector<int32_t>> RenderChat(const ServedModel& m, const ChatRequest& chat) {
  if (!m.chat_template) return InvalidArgument("this model has no chat template; use /v1/completions");
  ASSIGN_OR_RETURN(std::string text, m.chat_template->Render(chat.messages, chat.RenderOptions()));
  return m.tokenizer->Encode(text, /*add_special_tokens=*/false);
}

}  // namespace

void OpenAiServer::Handle(HttpRequest req, std::shared_ptr<HttpResponder> responder) {
  Context& ctx = *ctx_;
  HttpResponder& r = *responder;
  if (req.error_status) {
    SendError(r, ErrorOf(req.error_status, req.error_message, "invalid_request_error"));
    return;
  }
  const std::string path = StripQuery(req.target);
  const bool get = req.method == "GET", post = req.method == "POST";
  ServedModel* m = ctx.model.load();

  if (path == "/health") {
    if (m) {
      r.Send(200, kJson, "{}");
    } else {
      SendError(r, ErrorOf(503, "the model is loading", "server_error", "loading"));
    }
    return;
  }
  if (path == "/metrics" && get) {
    std::optional<EngineStats> stats = Stats();
    r.Send(200, "text/plain; version=0.0.4", ctx.metrics && m ? ctx.metrics->Render(stats ? &*stats : nullptr) : "");
    return;
  }
  const bool protected_path = path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize";
  if (protected_path && !ctx.options.api_key.empty() && req.authorization != "Bearer " + ctx.options.api_key) {
    SendError(r, ErrorOf(401, req.authorization.empty() ? "Missing API key: send 'Authorization: Bearer KEY'." : "Incorrect API key provided.",
                         "invalid_request_error", "invalid_api_key"));
    return;
  }
  static const char* kKnown[] = {"/v1/models", "/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"};
  if (std::find(std::begin(kKnown), std::end(kKnown), path) == std::end(kKnown)) {
    SendError(r, ErrorOf(404, "no route for " + req.method + " " + path, "invalid_request_error", "not_found"));
    return;
  }
  if ((path == "/v1/models") != get || (!get && !post)) {
    SendError(r, ErrorOf(405, "method " + req.method + " is not allowed for " + path, "invalid_request_error", "method_not_allowed"));
    return;
  }
  if (!m) {
    SendError(r, ErrorOf(503, "the model is loading", "server_error", "loading"));
    return;
  }
  const int max_model_len = m->engine->max_model_len();

  if (path == "/v1/models") {
    json card = {{"id", m->name}, {"object", "model"}, {"created", UnixTime()}, {"owned_by", "corolla"},
                 {"root", m->name}, {"max_model_len", max_model_len},
                 {"vocab_size", m->model->config().vocab_size}};
    r.Send(200, kJson, json{{"object", "list"}, {"data", json::array({card})}}.dump());
    return;
  }

  if (path == "/tokenize" || path == "/detokenize") {
    if (!m->tokenizer) return SendError(r, NoTokenizer());
    json j;
    if (auto e = ParseJsonObject(req.body, &j)) return SendError(r, *e);
    if (path == "/detokenize") {
      auto it = j.find("tokens");
      if (it == j.end() || !it->is_array()) return SendError(r, BadRequest("'tokens' must be a list of token ids", "tokens"));
      std::vector<int32_t> ids;
      for (const auto& t : *it) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
          return SendError(r, BadRequest("'tokens' must be a list of token ids", "tokens"));
        ids.push_back(t.get<int32_t>());
      }
      Result<std::string> text = m->tokenizer->Decode(ids, false);
      if (!text.ok()) return SendError(r, BadRequest(text.status().message(), "tokens"));
      r.Send(200, kJson, json{{"prompt", *text}}.dump(-1, ' ', false, json::error_handler_t::replace));
      return;
    }
    Result<std::vector<int32_t>> ids = InvalidArgument("'prompt' (a string) or 'messages' is required");
    if (j.contains("messages")) {
      ChatRequest chat;
      if (auto e = ParseChatRequest(req.body, &chat)) return SendError(r, *e);
      ids = RenderChat(*m, chat);
    } else if (auto it = j.find("prompt"); it != j.end() && it->is_string()) {
      bool add_special = true;
      if (auto a = j.find("add_special_tokens"); a != j.end() && a->is_boolean()) add_special = a->get<bool>();
      ids = m->tokenizer->Encode(it->get<std::string>(), add_special);
    }
    if (!ids.ok()) return SendError(r, BadRequest(ids.status().message()));
    r.Send(200, kJson, json{{"count", ids->size()}, {"max_model_len", max_model_len}, {"tokens", *ids}}.dump());
    return;
  }

  // Generation endpoints.
  const bool chat = path == "/v1/chat/completions";
  CompletionParams params;
  std::vector<int32_t> prompt;
  std::string echo_text;
  const char* prompt_param = chat ? "messages" : "prompt";
  if (chat) {
    ChatRequest c;
    if (auto e = ParseChatRequest(req.body, &c)) return SendError(r, *e);
    if (auto e = CheckModelName(c.params, *m)) return SendError(r, *e);
    if (!m->tokenizer) return SendError(r, NoTokenizer("messages"));
    Result<std::vector<int32_t>> ids = RenderChat(*m, c);
    if (!ids.ok()) return SendError(r, BadRequest("cannot apply the chat template: " + ids.status().message(), "messages"));
    prompt = std::move(ids).value();
    params = std::move(c.params);
  } else {
    CompletionRequest c;
    if (auto e = ParseCompletionRequest(req.body, &c)) return SendError(r, *e);
    if (auto e = CheckModelName(c.params, *m)) return SendError(r, *e);
    if (!m->tokenizer && !c.prompt_is_ids) return SendError(r, NoTokenizer("prompt"));
    if (!m->tokenizer && c.echo) return SendError(r, NoTokenizer("echo"));
    if (!m->tokenizer && !c.params.stop.empty()) return SendError(r, NoTokenizer("stop"));
    if (c.prompt_is_ids) {
      prompt = std::move(c.prompt_ids);
      if (c.echo) {
        Result<std::string> t = m->tokenizer->Decode(prompt, false);
        if (!t.ok()) return SendError(r, BadRequest(t.status().message(), "prompt"));
        echo_text = *t;
      }
    } else {
      Result<std::vector<int32_t>> ids = m->tokenizer->Encode(c.prompt_text, /*add_special_tokens=*/true);
      if (!ids.ok()) return SendError(r, BadRequest(ids.status().message(), "prompt"));
      prompt = std::move(ids).value();
      if (c.echo) echo_text = c.prompt_text;
    }
    params = std::move(c.params);
  }
  if (prompt.empty()) return SendError(r, BadRequest("the prompt is empty after tokenization", prompt_param));
  const int64_t num_prompt = static_cast<int64_t>(prompt.size());
  if (num_prompt >= max_model_len)
    return SendError(r, ErrorOf(400, "This model's maximum context length is " + std::to_string(max_model_len) +
                                         " tokens. However, your prompt has " + std::to_string(num_prompt) +
                                         " tokens, which leaves no room for the completion. Please reduce the length of the " +
                                         prompt_param + ".",
                                "invalid_request_error", "context_length_exceeded", prompt_param));
  if (params.max_tokens && num_prompt + *params.max_tokens > max_model_len)
    return SendError(r, ErrorOf(400, "This model's maximum context length is " + std::to_string(max_model_len) +
                                         " tokens. However, you requested " + std::to_string(num_prompt + *params.max_tokens) +
                                         " tokens (" + std::to_string(num_prompt) + " in the " + prompt_param + ", " +
                                         std::to_string(*params.max_tokens) + " in the completion). Please reduce the length of the " +
                                         prompt_param + " or completion.",
                                "invalid_request_error", "context_length_exceeded", "max_tokens"));

  GenerationRequest g;
  g.prompt = prompt;
  g.max_tokens = static_cast<int>(params.max_tokens.value_or(max_model_len - num_prompt));
  const GenerationConfig& gen = m->generation;
  SamplingParams& sp = g.sampling;
  sp.temperature = static_cast<float>(params.temperature ? *params.temperature
                                      : gen.do_sample.value_or(true) ? gen.temperature.value_or(1.0)
                                                                     : 0.0);
  sp.top_p = static_cast<float>(params.top_p.value_or(gen.top_p.value_or(1.0)));
  sp.top_k = static_cast<int>(params.top_k ? std::max<int64_t>(0, *params.top_k) : gen.top_k.value_or(0));
  sp.min_p = static_cast<float>(params.min_p.value_or(gen.min_p.value_or(0.0)));
  sp.seed = params.seed ? *params.seed : ctx.seed_base * 0x9e3779b97f4a7c15ull + ctx.next_request.fetch_add(1);
  g.stop_token_ids.assign(gen.eos_token_ids.begin(), gen.eos_token_ids.end());
  g.stop_token_ids.insert(g.stop_token_ids.end(), params.stop_token_ids.begin(), params.stop_token_ids.end());
  g.ignore_eos = params.ignore_eos;
  g.penalties.presence = static_cast<float>(params.presence_penalty);
  g.penalties.frequency = static_cast<float>(params.frequency_penalty);
  g.penalties.repetition = static_cast<float>(params.repetition_penalty);
  g.num_logprobs = params.num_logprobs;

  auto generation = std::make_shared<Generation>(&ctx, m, responder, chat, params);
  generation->set_stop_ids(g.stop_token_ids);
  generation->set_prompt(static_cast<int>(num_prompt), echo_text);
  // n choices: one engine request each, sharing the prompt; choice i samples with seed + i.
  std::vector<GenerationRequest> requests;
  std::vector<OutputCallback> callbacks;
  for (int i = 0; i < params.n; ++i) {
    requests.push_back(g);
    requests.back().sampling.seed = g.sampling.seed + static_cast<uint64_t>(i);
    callbacks.push_back([generation, i](const RequestOutput& out) { return generation->OnOutput(i, out); });
  }
  Result<std::vector<uint64_t>> ids = m->engine->SubmitAll(std::move(requests), std::move(callbacks));
  if (!ids.ok()) {
    const Status& s = ids.status();
    ApiError e = s.code() == StatusCode::kResourceExhausted ? ErrorOf(429, s.message(), "server_error", "queue_full")
                 : s.code() == StatusCode::kCancelled      ? ErrorOf(503, s.message(), "server_error", "shutting_down")
                                                            : BadRequest(s.message(), prompt_param);
    ctx.metrics->RequestFinished("rejected");
    SendError(r, e);
    return;
  }
  ServingEngine* engine = m->engine.get();
  r.OnDisconnect([engine, ids = *ids] {
    for (uint64_t id : ids) engine->Cancel(id);
  });
}

}  // namespace corolla::server
