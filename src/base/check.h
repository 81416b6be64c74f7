// COROLLA_CHECK(cond) << "context": aborts with file:line and the message when an invariant
// that the code itself guarantees is broken. Never use it for input a user can get wrong;
// return a Status for that (status.h).
#pragma once

#include <sstream>
#include <string>

namespace corolla::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  template <typename T>
  CheckFailure& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

// Lets `COROLLA_CHECK(x) << ...` be a void expression in both branches of the ternary.
struct Voidify {
  void operator&(const CheckFailure&) {}
};

}  // namespace corolla::internal

#define COROLLA_CHECK(cond)                    \
  (cond) ? (void)0                             \
         : ::corolla::internal::Voidify() &    \
               ::corolla::internal::CheckFailure(__FILE__, __LINE__, #cond)

#define COROLLA_CHECK_EQ(a, b) COROLLA_CHECK((a) == (b)) << (a) << " vs " << (b) << " "
#define COROLLA_CHECK_LE(a, b) COROLLA_CHECK((a) <= (b)) << (a) << " vs " << (b) << " "
#define COROLLA_CHECK_LT(a, b) COROLLA_CHECK((a) < (b)) << (a) << " vs " << (b) << " "
