// Status and Result<T>: the error channel for everything a user can get wrong (bad files, bad
// requests, out of memory). Broken invariants are COROLLA_CHECK (check.h), not Status.
// Values are immutable and cheap to move; safe to pass between threads.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "base/check.h"

namespace corolla {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller's input is wrong (shape, id, option)
  kNotFound,         // a file, tensor or key that should exist does not
  kCorrupt,          // a file exists but its contents are malformed
  kUnsupported,      // valid input we do not handle (model_type, dtype, template syntax)
  kOutOfRange,       // a value outside its limits (ids, context length)
  kResourceExhausted,
  kInternal,
  kCancelled,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

  // Returns a copy whose message is "context: message".
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status Corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
inline Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or the Status explaining why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    COROLLA_CHECK(!status_.ok()) << "Result constructed from an OK status without a value";
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & {
    COROLLA_CHECK(ok()) << status_.ToString();
    return *value_;
  }
  const T& value() const& {
    COROLLA_CHECK(ok()) << status_.ToString();
    return *value_;
  }
  T&& value() && {
    COROLLA_CHECK(ok()) << status_.ToString();
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace corolla

#define COROLLA_CONCAT_INNER(a, b) a##b
#define COROLLA_CONCAT(a, b) COROLLA_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` (a Status) is not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::corolla::Status _status = (expr);                \
    if (!_status.ok()) return _status;                 \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX())`: unwraps a Result or returns its Status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(COROLLA_CONCAT(_result_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
