// Minimal leveled logging to stderr: LOG(INFO) << "listening on " << port;
// Thread-safe: each statement is written with one fwrite. COROLLA_LOG_LEVEL=debug|info|warn|error.
#pragma once

#include <sstream>

namespace corolla {

enum class LogLevel { kDebug = 0, kInfo, kWarning, kError };

LogLevel MinLogLevel();
void SetMinLogLevel(LogLevel level);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  template <typename T>
  LogMessage& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace corolla

#define COROLLA_LOG_DEBUG ::corolla::LogLevel::kDebug
#define COROLLA_LOG_INFO ::corolla::LogLevel::kInfo
#define COROLLA_LOG_WARNING ::corolla::LogLevel::kWarning
#define COROLLA_LOG_ERROR ::corolla::LogLevel::kError
#define LOG(level)                                             \
  if (COROLLA_LOG_##level < ::corolla::MinLogLevel()) {        \
  } else                                                       \
    ::corolla::LogMessage(COROLLA_LOG_##level, __FILE__, __LINE__)
