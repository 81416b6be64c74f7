// Command-line options of one `corolla` subcommand: declared with a help line each, parsed from
// argv, with `--help` generated from the declarations. Unknown options and bad values are errors
// that name the option. Not thread-safe; used once per process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace corolla::cli {

class Flags {
 public:
  Flags(std::string command, std::string summary);

  // Declares options; `value` receives the parsed value and holds the default.
  void String(const std::string& name, std::string* value, const std::string& help);
  void Int(const std::string& name, int64_t* value, const std::string& help);
  void Float(const std::string& name, double* value, const std::string& help);
  void Bool(const std::string& name, bool* value, const std::string& help);  // --name / --no-name

  // Parses argv[first..]; Ok with *help_requested set when --help/-h was given (help printed).
  Status Parse(int argc, char** argv, int first, bool* help_requested);
  bool WasSet(const std::string& name) const;
  std::string Help() const;

 private:
  enum class Kind { kString, kInt, kFloat, kBool };
  struct Option {
    std::string name;
    Kind kind;
    void* value;
    std::string help;
    std::string default_text;
    bool set = false;
  };
  Option* Find(const std::string& name);

  std::string command_;
  std::string summary_;
  std::vector<Option> options_;
};

// "1,2,3" -> {1,2,3}; whitespace around items allowed.
Result<std::vector<int32_t>> ParseIdList(const std::string& text);
// "on" -> true, "off" -> false, "" -> `unset`; anything else is an error naming --`name`.
Result<bool> ParseOnOff(const std::string& name, const std::string& value, bool unset);

// Runs a subcommand body: prints a failed Status as "corolla CMD: error: ..." and returns 1.
int ReportStatus(const std::string& command, const Status& status);

}  // namespace corolla::cli
