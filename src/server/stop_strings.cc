#include "server/stop_strings.h"

#include <algorithm>
#include <utility>

namespace corolla::server {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string StopStringMatcher::Push(std::string_view text, bool* stopped) {
  *stopped = false;
  if (stopped_) {
    *stopped = true;
    return "";
  }
  pending_.append(text);
  if (stops_.empty()) return std::exchange(pending_, std::string());
  // The earliest complete stop string wins.
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = *stopped = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len) {
      if (std::string_view(pending_).substr(pending_.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringMatcher::Flush() {
  if (stopped_) return "";
  return std::exchange(pending_, std::string());
}

}  // namespace corolla::server
