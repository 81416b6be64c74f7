// Helpers shared by the tokenizer tests: loading the fetched real tokenizers and JSON fixtures.
// Test-only; not thread-safe.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace corolla::testing {

// `name` is a folder of .cache/tokenizers (fetched by scripts/fetch_tokenizers.sh).
inline std::string RealTokenizerDir(const std::string& name) {
  return ".cache/tokenizers/" + name;
}

// Loads a real tokenizer (once per test binary; Tokenizer is immutable and thread-safe), or
// records a failure saying how to fetch it and returns null.
inline const Tokenizer* LoadRealTokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  if (auto it = loaded.find(name); it != loaded.end()) return it->second.get();
  std::string dir = RealTokenizerDir(name);
  if (!std::filesystem::exists(dir + "/tokenizer.json")) {
    ADD_FAILURE() << dir << "/tokenizer.json is missing: run scripts/fetch_tokenizers.sh "
                  << "(tests run from the repository root)";
    return nullptr;
  }
  auto tok = Tokenizer::LoadFromDir(dir);
  if (!tok.ok()) {
    ADD_FAILURE() << tok.status().ToString();
    return nullptr;
  }
  return (loaded[name] = std::move(tok).value()).get();
}

inline nlohmann::json ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "cannot open " << path << " (tests run from the repository root)";
    return nlohmann::json();
  }
  std::stringstream s;
  s << in.rdbuf();
  return nlohmann::json::parse(s.str());
}

inline std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace corolla::testing
