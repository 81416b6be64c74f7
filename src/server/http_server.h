// HttpServer: HTTP/1.1 with keep-alive on Boost.Beast/Asio: one io_context run by a few
// threads, one strand per connection. Each request goes to the handler with an HttpResponder,
// through which any thread answers it once — a whole response, or a chunked stream (SSE). While
// a request is being answered the connection is watched, so a client that goes away is noticed
// (OnDisconnect) without waiting for the next write. Pipelined requests wait their turn.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "base/status.h"

namespace corolla::server {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path and query, e.g. "/v1/models"
  std::string body;
  std::string authorization;  // the Authorization header, if any
  // Set when the request could not be read as HTTP: 400 (malformed) or 413 (body over the
  // limit). The handler answers with an error; the connection closes after it.
  int error_status = 0;
  std::string error_message;
};

// Answers one request. Thread-safe; calls after the response has ended are ignored, and so are
// writes after the client has gone.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  virtual void Send(int status, const std::string& content_type, std::string body) = 0;
  virtual void StartStream(int status, const std::string& content_type) = 0;  // chunked
  virtual void Write(std::string data) = 0;
  virtual void End() = 0;
  // `fn` runs once, on an I/O thread, if the client goes away before the response ends (at
  // once if it already has).
  virtual void OnDisconnect(std::function<void()> fn) = 0;
};

using HttpHandler = std::function<void(HttpRequest, std::shared_ptr<HttpResponder>)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: an ephemeral port (see HttpServer::port)
  int num_threads = 2;
  size_t max_body_bytes = 8 << 20;
};

class HttpServer {
 public:
  // Binds, listens and starts the I/O threads.
  static Result<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options, HttpHandler handler);
  ~HttpServer();  // Stop()

  int port() const;
  int num_open_connections() const;
  // Closes the listening socket; open connections carry on.
  void StopAccepting();
  // Closes every connection and joins the I/O threads. Idempotent.
  void Stop();

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace corolla::server
