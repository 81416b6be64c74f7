#include "cli/flags.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace corolla::cli {

Flags::Flags(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void Flags::String(const std::string& name, std::string* value, const std::string& help) {
  options_.push_back({name, Kind::kString, value, help, value->empty() ? "" : *value});
}
void Flags::Int(const std::string& name, int64_t* value, const std::string& help) {
  options_.push_back({name, Kind::kInt, value, help, std::to_string(*value)});
}
void Flags::Float(const std::string& name, double* value, const std::string& help) {
  std::ostringstream s;
  s << *value;
  options_.push_back({name, Kind::kFloat, value, help, s.str()});
}
void Flags::Bool(const std::string& name, bool* value, const std::string& help) {
  options_.push_back({name, Kind::kBool, value, help, *value ? "true" : "false"});
}

Flags::Option* Flags::Find(const std::string& name) {
  for (auto& o : options_)
    if (o.name == name) return &o;
  return nullptr;
}

bool Flags::WasSet(const std::string& name) const {
  for (const auto& o : options_)
    if (o.name == name) return o.set;
  return false;
}

Status Flags::Parse(int argc, char** argv, int first, bool* help_requested) {
  *help_requested = false;
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(Help().c_str(), stdout);
      *help_requested = true;
      return Status::Ok();
    }
    if (arg.rfind("--", 0) != 0) return InvalidArgument("unexpected argument '" + arg + "'");
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    Option* opt = Find(name);
    if (opt == nullptr && name.rfind("no-", 0) == 0) {
      Option* neg = Find(name.substr(3));
      if (neg != nullptr && neg->kind == Kind::kBool && !has_value) {
        *static_cast<bool*>(neg->value) = false;
        neg->set = true;
        continue;
      }
    }
    if (opt == nullptr) return InvalidArgument("unknown option --" + name + " (see --help)");
    opt->set = true;
    if (opt->kind == Kind::kBool) {
      if (!has_value) {
        *static_cast<bool*>(opt->value) = true;
      } else if (value == "true" || value == "1") {
        *static_cast<bool*>(opt->value) = true;
      } else if (value == "false" || value == "0") {
        *static_cast<bool*>(opt->value) = false;
      } else {
        return InvalidArgument("--" + name + " expects true or false, got '" + value + "'");
      }
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) return InvalidArgument("--" + name + " needs a value");
      value = argv[++i];
    }
    const char* s = value.c_str();
    char* end = nullptr;
    errno = 0;
    switch (opt->kind) {
      case Kind::kString:
        *static_cast<std::string*>(opt->value) = value;
        break;
      case Kind::kInt: {
        long long v = std::strtoll(s, &end, 10);
        if (value.empty() || *end != '\0' || errno != 0)
          return InvalidArgument("--" + name + " expects an integer, got '" + value + "'");
        *static_cast<int64_t*>(opt->value) = v;
        break;
      }
      case Kind::kFloat: {
        double v = std::strtod(s, &end);
        if (value.empty() || *end != '\0' || errno != 0)
          return InvalidArgument("--" + name + " expects a number, got '" + value + "'");
        *static_cast<double*>(opt->value) = v;
        break;
      }
      case Kind::kBool:
        break;
    }
  }
  return Status::Ok();
}

std::string Flags::Help() const {
  std::ostringstream s;
  s << "usage: corolla " << command_ << " [options]\n\n" << summary_ << "\n\noptions:\n";
  for (const auto& o : options_) {
    std::string left = "  --" + o.name;
    if (o.kind != Kind::kBool) left += " VALUE";
    s << left;
    if (left.size() < 28) s << std::string(28 - left.size(), ' ');
    else s << "\n" << std::string(28, ' ');
    s << o.help;
    if (!o.default_text.empty()) s << " (default: " << o.default_text << ")";
    s << "\n";
  }
  s << "  --help                    show this help\n";
  return s.str();
}

Result<bool> ParseOnOff(const std::string& name, const std::string& value, bool unset) {
  if (value.empty()) return unset;
  if (value == "on") return true;
  if (value == "off") return false;
  return InvalidArgument("--" + name + " must be on or off, not '" + value + "'");
}

Result<std::vector<int32_t>> ParseIdList(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(" \t\n"), e = item.find_last_not_of(" \t\n");
    if (b == std::string::npos) return InvalidArgument("empty item in id list '" + text + "'");
    item = item.substr(b, e - b + 1);
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || v < INT32_MIN || v > INT32_MAX)
      return InvalidArgument("'" + item + "' is not a token id");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return InvalidArgument("empty id list");
  return ids;
}

int ReportStatus(const std::string& command, const Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "corolla %s: error: %s\n", command.c_str(), status.ToString().c_str());
  return 1;
}

}  // namespace corolla::cli
