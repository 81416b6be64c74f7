// Test helper of the multi-process tests: runs the `corolla` binary (COROLLA_BINARY, set by the
// test target) with a command line and returns whether it exited 0 and what it printed.
#pragma once

#include <cstdio>
#include <string>
#include <utility>

namespace corolla {

// stdout, and stderr unless `with_stderr` is false.
inline std::pair<bool, std::string> RunCorolla(const std::string& args, bool with_stderr = true) {
  const std::string cmd = std::string(COROLLA_BINARY) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return {false, "popen failed"};
  std::string output;
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe)) output += buf;
  return {pclose(pipe) == 0, output};
}

}  // namespace corolla
