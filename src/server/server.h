// OpenAiServer: the OpenAI-compatible HTTP API over a ServingEngine (an AsyncEngine, or under
// --dp rank 0's DataParallelEngine). It listens at once and answers /health with 503 until a
// model is attached (so load progress is observable), then serves /v1/chat/completions,
// /v1/completions, /v1/models, /tokenize, /detokenize, /metrics.
// Requests are validated on the I/O threads, tokens are detokenized and checked for stop
// strings on the engine's output thread (overlapping the next step), and responses go back
// through the connection's strand.
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/async_engine.h"
#include "model/config.h"
#include "model/model.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace corolla::server {

struct ServerOptions {
  HttpServerOptions http;
  std::string api_key;            // empty: no authentication
  std::string served_model_name;  // empty: the model directory's name
};

// Everything a loaded model brings; owned by the server once attached.
struct ServedModel {
  std::string name;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;  // null: token-id prompts through /v1/completions only
  std::optional<ChatTemplate> chat_template;
  GenerationConfig generation;
  std::unique_ptr<ServingEngine> engine;  // over model and backend
};

// Loads the tokenizer, chat template (optional) and generation config of model directory `dir`
// and starts an AsyncEngine over the loaded model. `name` empty: the directory's name. `dir`
// empty (random weights without a checkpoint): no tokenizer, the generation config from the
// model's config; a directory without tokenizer.json (the test fixtures): no tokenizer either.
// Without one, completions take token-id prompts, stream and return "token_ids" beside an
// empty "text", and every endpoint that needs text answers 400.
Result<std::unique_ptr<ServedModel>> MakeServedModel(const std::string& dir, std::unique_ptr<Backend> backend,
                                                     std::unique_ptr<Model> model, const EngineOptions& engine_options,
                                                     const AsyncEngineOptions& async_options, std::string name);

// The same with the engine from `make_engine`, called last with the model and backend that the
// ServedModel then owns (it may keep references to both).
using EngineFactory = std::function<Result<std::unique_ptr<ServingEngine>>(Model& model, Backend& backend)>;
Result<std::unique_ptr<ServedModel>> MakeServedModel(const std::string& dir, std::unique_ptr<Backend> backend,
                                                     std::unique_ptr<Model> model, const EngineFactory& make_engine,
                                                     std::string name);

class OpenAiServer {
 public:
  static Result<std::unique_ptr<OpenAiServer>> Start(ServerOptions options);
  ~OpenAiServer();

  // Starts serving the model (until now every model endpoint answered 503).
  void Attach(std::unique_ptr<ServedModel> model);
  int port() const { return http_->port(); }
  const std::string& model_name() const;
  // Engine statistics, or nothing while loading.
  std::optional<EngineStats> Stats() const;
  int num_open_connections() const { return http_->num_open_connections(); }

  // Stops accepting, lets in-flight requests finish for up to `drain` (then aborts them), and
  // closes every connection. Idempotent.
  void Shutdown(std::chrono::milliseconds drain = std::chrono::seconds(30));

  struct Context;  // shared with the per-request state in server.cc

 private:
  explicit OpenAiServer(ServerOptions options);
  void Handle(HttpRequest request, std::shared_ptr<HttpResponder> responder);
  std::shared_ptr<Context> ctx_;
  std::unique_ptr<HttpServer> http_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace corolla::server
