// StopStringMatcher: finds stop strings in streamed text. Text that could still be the start
// of a stop string is held back until the next piece decides it, so a stream never shows the
// beginning of a stop string that then completes. The stop string itself is not output (as in
// OpenAI's API). One per request; not thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace corolla::server {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);

  // Appends `text`; returns what may be output now. When a stop string completes, returns the
  // text before it, sets *stopped, and drops everything after.
  std::string Push(std::string_view text, bool* stopped);
  // The held-back rest at the end of generation.
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace corolla::server
