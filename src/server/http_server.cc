#include "server/http_server.h"

#include <atomic>
#include <deque>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "base/logging.h"

namespace corolla::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

constexpr auto kIdleTimeout = std::chrono::seconds(120);  // between keep-alive requests

const char* StatusText(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

std::string HeaderBlock(int status, const std::string& content_type, bool keep_alive, const std::string& length_or_chunked) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + StatusText(status) + "\r\n";
  h += "Content-Type: " + content_type + "\r\n";
  h += length_or_chunked;
  if (content_type == "text/event-stream") h += "Cache-Control: no-cache\r\n";
  h += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  h += "\r\n";
  return h;
}

class Session;

// Carries the request number so a late call for an earlier request cannot touch a later one.
class Responder : public HttpResponder {
 public:
  Responder(std::shared_ptr<Session> session, uint64_t request_no) : session_(std::move(session)), request_no_(request_no) {}
  void Send(int status, const std::string& content_type, std::string body) override;
  void StartStream(int status, const std::string& content_type) override;
  void Write(std::string data) override;
  void End() override;
  void OnDisconnect(std::function<void()> fn) override;

 private:
  std::shared_ptr<Session> session_;
  uint64_t request_no_;
};

struct Shared {
  HttpHandler handler;
  size_t max_body_bytes;
  std::atomic<int> num_open{0};
  std::mutex mu;
  std::vector<std::weak_ptr<Session>> sessions;  // for Stop
};

// One connection. Every member is touched on the connection's strand only.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<Shared> shared) : stream_(std::move(socket)), shared_(std::move(shared)) {
    ++shared_->num_open;
  }
  ~Session() { --shared_->num_open; }

  void Start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->DoRead(); });
  }
  void Close() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->CloseNow(); });
  }

  // Called through Responder, on the strand.
  void Post(uint64_t request_no, std::function<void(Session&)> fn) {
    net::post(stream_.get_executor(), [self = shared_from_this(), request_no, fn = std::move(fn)] {
      if (request_no != self->request_no_ || !self->response_active_ || self->response_ended_) return;
      fn(*self);
    });
  }
  void DoSend(int status, const std::string& content_type, std::string body) {
    std::string out = HeaderBlock(status, content_type, keep_alive_, "Content-Length: " + std::to_string(body.size()) + "\r\n");
    out += body;
    response_ended_ = true;
    Enqueue(std::move(out), /*last=*/true);
  }
  void DoStartStream(int status, const std::string& content_type) {
    if (streaming_) return;
    streaming_ = true;
    Enqueue(HeaderBlock(status, content_type, keep_alive_, "Transfer-Encoding: chunked\r\n"), false);
  }
  void DoWrite(std::string data) {
    if (!streaming_ || data.empty()) return;
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
    Enqueue(size + std::move(data) + "\r\n", false);
  }
  void DoEnd() {
    if (!streaming_) return;
    response_ended_ = true;
    Enqueue("0\r\n\r\n", true);
  }
  void DoOnDisconnect(std::function<void()> fn) {
    if (peer_gone_) {
      fn();
    } else {
      on_disconnect_ = std::move(fn);
    }
  }

 private:
  void DoRead() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(shared_->max_body_bytes);
    parser_->header_limit(64 * 1024);
    stream_.expires_after(kIdleTimeout);
    http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    stream_.expires_never();
    if (closed_) return;
    HttpRequest request;
    if (ec == http::error::body_limit) {
      request.error_status = 413;
      request.error_message = "the request body exceeds the limit of " + std::to_string(shared_->max_body_bytes) + " bytes";
    } else if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
               ec == beast::error::timeout || ec == net::error::operation_aborted) {
      CloseNow();
      return;
    } else if (ec) {
      request.error_status = 400;
      request.error_message = "malformed HTTP request: " + ec.message();
    }
    ++request_no_;
    response_active_ = true;
    response_ended_ = false;
    streaming_ = false;
    on_disconnect_ = nullptr;
    if (request.error_status == 0) {
      auto& msg = parser_->get();
      request.method = std::string(msg.method_string());
      request.target = std::string(msg.target());
      request.body = std::move(msg.body());
      if (auto it = msg.find(http::field::authorization); it != msg.end()) request.authorization = std::string(it->value());
      keep_alive_ = msg.keep_alive();
      StartWatch();
    } else {
      keep_alive_ = false;
    }
    shared_->handler(std::move(request), std::make_shared<Responder>(shared_from_this(), request_no_));
  }

  // Reads while a response is being produced: EOF or an error means the client is gone; bytes
  // are kept for the next request.
  void StartWatch() {
    if (watch_pending_ || peer_gone_) return;
    watch_pending_ = true;
    stream_.socket().async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->OnWatch(ec, n);
    });
  }

  void OnWatch(beast::error_code ec, size_t n) {
    watch_pending_ = false;
    if (closed_) return;
    if (!ec) buffer_.commit(n);
    if (ec) {
      PeerGone();
      if (!response_active_) CloseNow();
      return;
    }
    if (!response_active_) DoRead();  // the next request began arriving after the response ended
  }

  void PeerGone() {
    peer_gone_ = true;
    if (response_active_ && on_disconnect_) {
      auto fn = std::move(on_disconnect_);
      on_disconnect_ = nullptr;
      fn();
    }
  }

  void Enqueue(std::string data, bool last) {
    if (peer_gone_ || closed_) return;
    queue_.push_back({std::move(data), last});
    if (!writing_) WriteNext();
  }

  void WriteNext() {
    writing_ = true;
    net::async_write(stream_.socket(), net::buffer(queue_.front().data),
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnWrite(ec); });
  }

  void OnWrite(beast::error_code ec) {
    writing_ = false;
    if (ec) {
      queue_.clear();
      PeerGone();
      CloseNow();
      return;
    }
    bool last = queue_.front().last;
    queue_.pop_front();
    if (last) {
      response_active_ = false;
      on_disconnect_ = nullptr;
      if (peer_gone_) {
        CloseNow();
        return;
      }
      if (!keep_alive_) {
        if (watch_pending_) {
          CloseNow();  // the request was read whole; nothing to drain
        } else {
          LingerClose();
        }
        return;
      }
      if (!watch_pending_) DoRead();  // else OnWatch starts the next read
    }
    if (!queue_.empty()) WriteNext();
  }

  // Ends our side, then reads and discards what the client still sends (e.g. the rest of an
  // oversized body) for a while, so it sees our response instead of a reset.
  void LingerClose() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    linger_buffer_.resize(64 * 1024);
    Drain();
  }
  void Drain() {
    if (closed_) return;
    stream_.expires_after(std::chrono::seconds(5));
    stream_.async_read_some(net::buffer(linger_buffer_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) {
        self->CloseNow();
      } else {
        self->Drain();
      }
    });
  }

  void CloseNow() {
    if (closed_) return;
    closed_ = true;
    if (response_active_ && !peer_gone_) PeerGone();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  struct Pending {
    std::string data;
    bool last;
  };

  beast::tcp_stream stream_;
  std::shared_ptr<Shared> shared_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  uint64_t request_no_ = 0;
  bool response_active_ = false;
  bool response_ended_ = false;
  bool streaming_ = false;
  bool keep_alive_ = true;
  bool watch_pending_ = false;
  bool peer_gone_ = false;
  bool closed_ = false;
  bool writing_ = false;
  std::deque<Pending> queue_;
  std::vector<char> linger_buffer_;
  std::function<void()> on_disconnect_;
};

void Responder::Send(int status, const std::string& content_type, std::string body) {
  session_->Post(request_no_, [=, body = std::move(body)](Session& s) mutable { s.DoSend(status, content_type, std::move(body)); });
}
void Responder::StartStream(int status, const std::string& content_type) {
  session_->Post(request_no_, [=](Session& s) { s.DoStartStream(status, content_type); });
}
void Responder::Write(std::string data) {
  session_->Post(request_no_, [data = std::move(data)](Session& s) mutable { s.DoWrite(std::move(data)); });
}
void Responder::End() {
  session_->Post(request_no_, [](Session& s) { s.DoEnd(); });
}
void Responder::OnDisconnect(std::function<void()> fn) {
  session_->Post(request_no_, [fn = std::move(fn)](Session& s) mutable { s.DoOnDisconnect(std::move(fn)); });
}

}  // namespace

class HttpServer::Impl {
 public:
  Impl(const HttpServerOptions& options, HttpHandler handler)
      : options_(options), ioc_(options.num_threads), acceptor_(net::make_strand(ioc_)), shared_(std::make_shared<Shared>()) {
    shared_->handler = std::move(handler);
    shared_->max_body_bytes = options.max_body_bytes;
  }

  Status Listen() {
    beast::error_code ec;
    auto address = net::ip::make_address(options_.host, ec);
    if (ec) return InvalidArgument("bad host address '" + options_.host + "': " + ec.message());
    tcp::endpoint endpoint(address, static_cast<unsigned short>(options_.port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec)
      return Status(StatusCode::kUnsupported,
                    "cannot listen on " + options_.host + ":" + std::to_string(options_.port) + ": " + ec.message());
    port_ = acceptor_.local_endpoint().port();
    Accept();
    for (int i = 0; i < std::max(1, options_.num_threads); ++i) threads_.emplace_back([this] { ioc_.run(); });
    return Status::Ok();
  }

  void Accept() {
    acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
      if (!ec) {
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        auto session = std::make_shared<Session>(std::move(socket), shared_);
        {
          std::lock_guard<std::mutex> lock(shared_->mu);
          auto& v = shared_->sessions;
          if (v.size() > 256) v.erase(std::remove_if(v.begin(), v.end(), [](auto& w) { return w.expired(); }), v.end());
          v.push_back(session);
        }
        session->Start();
      } else {
        LOG(WARNING) << "accept: " << ec.message();
      }
      Accept();
    });
  }

  void StopAccepting() {
    net::post(acceptor_.get_executor(), [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
    });
  }

  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    StopAccepting();
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      for (auto& w : shared_->sessions)
        if (auto s = w.lock()) s->Close();
    }
    // Let the closes run, then stop the loop.
    for (int i = 0; i < 100 && shared_->num_open.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ioc_.stop();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  HttpServerOptions options_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  std::shared_ptr<Shared> shared_;
  std::vector<std::thread> threads_;
  int port_ = 0;
  bool stopped_ = false;
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { Stop(); }

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options, HttpHandler handler) {
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  RETURN_IF_ERROR(impl->Listen());
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->port_; }
int HttpServer::num_open_connections() const { return impl_->shared_->num_open.load(); }
void HttpServer::StopAccepting() { impl_->StopAccepting(); }
void HttpServer::Stop() { impl_->Stop(); }

}  // namespace corolla::server
