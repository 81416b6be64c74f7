#include "base/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace corolla {
namespace {

LogLevel LevelFromEnv() {
  const char* env = std::getenv("COROLLA_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  if (std::strcmp(env, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(env, "warn") == 0) return LogLevel::kWarning;
  if (std::strcmp(env, "error") == 0) return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<LogLevel>& Level() {
  static std::atomic<LogLevel> level{LevelFromEnv()};
  return level;
}

}  // namespace

LogLevel MinLogLevel() { return Level().load(std::memory_order_relaxed); }
void SetMinLogLevel(LogLevel level) { Level().store(level); }

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  static const char kTags[] = "DIWE";
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  const char* base = std::strrchr(file, '/');
  stream_ << kTags[static_cast<int>(level)] << " " << stamp << " " << (base ? base + 1 : file) << ":"
          << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << "\n";
  std::string s = stream_.str();
  std::fwrite(s.data(), 1, s.size(), stderr);
  (void)level_;
}

}  // namespace corolla
