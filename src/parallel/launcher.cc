#include "parallel/launcher.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace corolla {
namespace {

// A TCP port that was free a moment ago (the kernel's pick for port 0).
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = 0;
  socklen_t len = sizeof(sa);
  int port = 29500;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0)
    port = ntohs(sa.sin_port);
  if (fd >= 0) ::close(fd);
  return port;
}

// The ranks, for the handler below (fixed size: a signal handler must not allocate).
constexpr int kMaxLocalRanks = 256;
volatile pid_t g_ranks[kMaxLocalRanks];
volatile int g_num_ranks = 0;

volatile sig_atomic_t g_num_signals = 0;

// SIGTERM / SIGINT to the launcher (a timeout, Ctrl-C) go on to its ranks, which would
// otherwise keep their GPUs, waiting on each other; the launcher then waits for them and exits
// as they do (a server's ranks drain first). A second signal kills them.
void ForwardToRanks(int sig) {
  g_num_signals = g_num_signals + 1;
  for (int i = 0; i < g_num_ranks; ++i)
    if (g_ranks[i] > 0) ::kill(g_ranks[i], g_num_signals > 1 ? SIGKILL : sig);
}

}  // namespace

std::optional<int> SpawnLocalRanks(int world_size, int argc, char** argv) {
  if (world_size <= 1 || std::getenv("RANK") != nullptr) return std::nullopt;
  if (world_size > kMaxLocalRanks) {
    std::fprintf(stderr, "corolla: %d ranks on one node is more than %d\n", world_size, kMaxLocalRanks);
    return 1;
  }
  const std::string port = std::to_string(FreePort());
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int rank = 0; rank < world_size; ++rank) {
    pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("corolla: fork");
      for (pid_t p : pids) ::kill(p, SIGTERM);
      return 1;
    }
    if (pid == 0) {
      const std::string r = std::to_string(rank), w = std::to_string(world_size);
      setenv("RANK", r.c_str(), 1);
      setenv("LOCAL_RANK", r.c_str(), 1);
      setenv("WORLD_SIZE", w.c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", w.c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port.c_str(), 1);
      setenv("NCCL_NVLS_ENABLE", "0", 1);  // never NVLink multicast
      if (rank != 0) {
        int devnull = ::open("/dev/null", O_WRONLY);
        if (devnull >= 0) ::dup2(devnull, STDOUT_FILENO);
      }
      std::vector<char*> args(argv, argv + argc);
      args.push_back(nullptr);
      ::execv("/proc/self/exe", args.data());
      std::perror("corolla: exec");
      ::_exit(127);
    }
    pids.push_back(pid);
    g_ranks[g_num_ranks] = pid;
    g_num_ranks = g_num_ranks + 1;
  }
  ::signal(SIGTERM, ForwardToRanks);
  ::signal(SIGINT, ForwardToRanks);
  // Wait for every rank; once one fails, stop the others (they would wait on it forever).
  int result = 0;
  size_t remaining = pids.size();
  while (remaining > 0) {
    int status = 0;
    pid_t done = ::waitpid(-1, &status, 0);
    if (done < 0 && errno == EINTR) continue;  // a forwarded signal
    if (done < 0) break;
    bool ours = false;
    for (pid_t& p : pids)
      if (p == done) {
        p = -1;
        ours = true;
      }
    if (!ours) continue;
    for (int i = 0; i < g_num_ranks; ++i)
      if (g_ranks[i] == done) g_ranks[i] = -1;  // reaped: its pid may be reused
    --remaining;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && result == 0) {
      result = code;
      for (pid_t p : pids)
        if (p > 0) ::kill(p, SIGTERM);
    }
  }
  return result;
}

}  // namespace corolla
