#include "parallel/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/check.h"

namespace corolla {
namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

Status SendAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Internal(Errno("bootstrap send"));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status RecvAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return Internal("bootstrap recv: peer closed the connection");
    if (r < 0) return Internal(Errno("bootstrap recv"));
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::Ok();
}

// A length-prefixed blob.
Status SendBlob(int fd, const std::string& s) {
  uint64_t n = s.size();
  RETURN_IF_ERROR(SendAll(fd, &n, sizeof(n)));
  return SendAll(fd, s.data(), s.size());
}

Status RecvBlob(int fd, std::string* s) {
  uint64_t n = 0;
  RETURN_IF_ERROR(RecvAll(fd, &n, sizeof(n)));
  if (n > (uint64_t{1} << 34)) return Internal("bootstrap recv: implausible blob of " + std::to_string(n) + " bytes");
  s->resize(n);
  return RecvAll(fd, s->data(), n);
}

void NoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

TcpStore::~TcpStore() {
  for (int fd : peers_)
    if (fd >= 0) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

Result<std::unique_ptr<TcpStore>> TcpStore::Listen(int port, int world_size) {
  std::unique_ptr<TcpStore> store(new TcpStore(world_size, 0));
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Internal(Errno("bootstrap socket"));
  store->listen_fd_ = fd;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0)
    return Internal(Errno("bootstrap: rank 0 cannot listen on port " + std::to_string(port)));
  if (::listen(fd, world_size) != 0) return Internal(Errno("bootstrap listen"));
  socklen_t len = sizeof(sa);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return Internal(Errno("bootstrap getsockname"));
  store->port_ = ntohs(sa.sin_port);
  return store;
}

Result<std::unique_ptr<TcpStore>> TcpStore::ListenForGroup(int world_size) { return Listen(0, world_size); }

Status TcpStore::AcceptPeers() {
  COROLLA_CHECK(rank_ == 0 && listen_fd_ >= 0 && peers_.empty());
  peers_.assign(world_size_, -1);
  for (int i = 1; i < world_size_; ++i) {
    int c = ::accept(listen_fd_, nullptr, nullptr);
    if (c < 0) return Internal(Errno("bootstrap accept"));
    NoDelay(c);
    int32_t peer = -1;
    Status got = RecvAll(c, &peer, sizeof(peer));
    if (!got.ok() || peer <= 0 || peer >= world_size_ || peers_[peer] >= 0) {
      ::close(c);
      if (!got.ok()) return got;
      return Internal("bootstrap: a peer announced rank " + std::to_string(peer) + " twice or out of range");
    }
    peers_[peer] = c;
  }
  return Status::Ok();
}

std::string TcpStore::local_address() const {
  if (rank_ == 0 || peers_.empty() || peers_[0] < 0) return "";
  sockaddr_in sa{};
  socklen_t len = sizeof(sa);
  if (::getsockname(peers_[0], reinterpret_cast<sockaddr*>(&sa), &len) != 0) return "";
  char text[INET_ADDRSTRLEN] = {};
  if (::inet_ntop(AF_INET, &sa.sin_addr, text, sizeof(text)) == nullptr) return "";
  return text;
}

Result<std::unique_ptr<TcpStore>> TcpStore::Connect(const std::string& addr, int port, int world_size, int rank,
                                                    double timeout_s) {
  std::unique_ptr<TcpStore> store(new TcpStore(world_size, rank));
  const std::string where = addr + ":" + std::to_string(port);
  if (world_size == 1) return store;
  if (rank == 0) {
    ASSIGN_OR_RETURN(store, Listen(port, world_size));
    RETURN_IF_ERROR(store->AcceptPeers());
    return store;
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (int e = ::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res); e != 0)
    return InvalidArgument("MASTER_ADDR " + addr + ": " + gai_strerror(e));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int fd = -1;
  while (true) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) break;
    if (fd >= 0) ::close(fd);
    if (std::chrono::steady_clock::now() > deadline) {
      ::freeaddrinfo(res);
      return Internal(Errno("bootstrap: rank " + std::to_string(rank) + " could not reach rank 0 at " + where));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::freeaddrinfo(res);
  NoDelay(fd);
  store->peers_.assign(1, fd);
  int32_t me = rank;
  RETURN_IF_ERROR(SendAll(fd, &me, sizeof(me)));
  return store;
}

Result<std::vector<std::string>> TcpStore::AllGather(const std::string& blob) {
  std::vector<std::string> all(world_size_);
  all[rank_] = blob;
  if (world_size_ == 1) return all;
  if (rank_ == 0) {
    for (int r = 1; r < world_size_; ++r) RETURN_IF_ERROR(RecvBlob(peers_[r], &all[r]));
    for (int r = 1; r < world_size_; ++r)
      for (int i = 0; i < world_size_; ++i) RETURN_IF_ERROR(SendBlob(peers_[r], all[i]));
    return all;
  }
  RETURN_IF_ERROR(SendBlob(peers_[0], blob));
  for (int i = 0; i < world_size_; ++i) RETURN_IF_ERROR(RecvBlob(peers_[0], &all[i]));
  return all;
}

Status TcpStore::Barrier() { return AllGather("").status(); }

}  // namespace corolla
