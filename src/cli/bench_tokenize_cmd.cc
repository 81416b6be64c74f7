// `corolla bench tokenize`: single-threaded encoding speed (MB/s) of the golden corpus and of a
// generated ~10 MB multilingual text. scripts/bench_tokenize_peer.js measures @lenml/tokenizers
// on the same texts (the generator below is mirrored there; both print its checksum).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace corolla::cli {
namespace {

// Deterministic text: English and made-up words, numbers, CJK, Cyrillic, punctuation, emoji,
// code-like identifiers and indented newlines, from a 32-bit LCG. Keep in step with
// scripts/bench_tokenize_peer.js.
std::string GenerateText(size_t num_bytes) {
  static const char* kWords[] = {"the", "of", "and", "to", "in", "is", "that", "for", "it", "with",
                                 "as", "was", "on", "are", "by", "this", "be", "from", "or", "have",
                                 "model", "token", "server", "request", "return", "value", "error",
                                 "function", "memory", "expert", "layer", "attention", "cache"};
  static const char* kSyllables[] = {"ka", "ri", "to", "mon", "zel", "qua", "ber", "lin", "dor",
                                     "fi", "ga", "hu", "sto", "pre", "ment", "tion", "ex", "ul"};
  static const char* kPunct[] = {".", ",", "!", "?", ";", ":", "(", ")", "\"", "'", "->", "==",
                                 "{", "}", "[", "]", "#", "//", "+=", "..."};
  uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  };
  std::string s;
  s.reserve(num_bytes + 64);
  while (s.size() < num_bytes) {
    uint32_t r = next() % 100;
    if (r < 40) {
      s += kWords[next() % (sizeof(kWords) / sizeof(kWords[0]))];
    } else if (r < 55) {
      for (uint32_t k = 2 + next() % 3; k > 0; --k)
        s += kSyllables[next() % (sizeof(kSyllables) / sizeof(kSyllables[0]))];
    } else if (r < 63) {
      s += std::to_string(next() % 100000);
    } else if (r < 72) {
      for (uint32_t k = 1 + next() % 6; k > 0; --k) utf8::Append(0x4E00 + next() % 2000, &s);
    } else if (r < 77) {
      for (uint32_t k = 2 + next() % 6; k > 0; --k) utf8::Append(0x430 + next() % 32, &s);
    } else if (r < 84) {
      s += kPunct[next() % (sizeof(kPunct) / sizeof(kPunct[0]))];
    } else if (r < 90) {
      s += '\n';
      s.append(next() % 9, ' ');
      continue;
    } else if (r < 93) {
      utf8::Append(0x1F600 + next() % 80, &s);
    } else {
      s += "var_";
      s += kSyllables[next() % (sizeof(kSyllables) / sizeof(kSyllables[0]))];
      s += std::to_string(next() % 100);
    }
    s += ' ';
  }
  return s;
}

uint32_t Fnv1a(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

Result<std::vector<std::string>> GoldenTexts(const std::string& dir) {
  std::vector<std::string> texts;
  for (const char* name : {"qwen3", "deepseek_v3"}) {
    std::string path = dir + "/" + name + ".json";
    std::ifstream in(path);
    if (!in) return NotFound("cannot open " + path + " (run from the repository root or pass --golden-dir)");
    std::stringstream s;
    s << in.rdbuf();
    auto j = nlohmann::json::parse(s.str(), nullptr, false);
    if (j.is_discarded() || !j.contains("cases")) return Corrupt(path + ": no \"cases\"");
    for (const auto& c : j["cases"]) texts.push_back(c["text"].get<std::string>());
  }
  return texts;
}

Status Bench(int argc, char** argv, bool* help) {
  std::string dir, golden_dir = "tests/data/tokenizer-golden", write_text;
  int64_t mb = 10, golden_repeats = 20;
  Flags flags("bench tokenize",
              "Measures single-threaded Encode speed in MB/s on the golden corpus and on a "
              "generated multilingual text; compare with scripts/bench_tokenize_peer.js.");
  flags.String("tokenizer", &dir, "directory with tokenizer.json");
  flags.String("golden-dir", &golden_dir, "folder of the golden files (qwen3.json, deepseek_v3.json)");
  flags.Int("mb", &mb, "size of the generated text in MB");
  flags.Int("golden-repeats", &golden_repeats, "passes over the golden corpus");
  flags.String("write-text", &write_text,
               "also write the generated text to this file (for scripts/bench_tokenize_hf.py)");
  RETURN_IF_ERROR(flags.Parse(argc, argv, argc > 1 && std::string(argv[1]) == "bench" ? 3 : 2, help));
  if (*help) return Status::Ok();
  if (dir.empty()) return InvalidArgument("--tokenizer DIR is required");
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::LoadFromDir(dir));
  double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSIGN_OR_RETURN(std::vector<std::string> golden, GoldenTexts(golden_dir));
  std::string big = GenerateText(static_cast<size_t>(mb) << 20);
  if (!write_text.empty()) {
    std::ofstream out(write_text, std::ios::binary);
    out << big;
    if (!out) return NotFound("cannot write " + write_text);
  }

  size_t golden_bytes = 0, golden_tokens = 0;
  t0 = Clock::now();
  for (int64_t r = 0; r < golden_repeats; ++r)
    for (const auto& text : golden) {
      ASSIGN_OR_RETURN(auto ids, tokenizer->Encode(text));
      golden_bytes += text.size();
      golden_tokens += ids.size();
    }
  double golden_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // The large text is encoded in 4 KB-ish chunks cut at newlines, as requests would arrive;
  // its first pass sees a cold word cache for most words.
  std::vector<std::string_view> chunks;
  std::string_view rest = big;
  while (!rest.empty()) {
    size_t cut = rest.size() <= 4096 ? rest.size() : rest.find('\n', 4096);
    if (cut == std::string_view::npos) cut = rest.size();
    chunks.push_back(rest.substr(0, cut));
    rest.remove_prefix(cut);
  }
  size_t big_tokens = 0;
  t0 = Clock::now();
  for (auto chunk : chunks) {
    ASSIGN_OR_RETURN(auto ids, tokenizer->Encode(chunk));
    big_tokens += ids.size();
  }
  double big_s = std::chrono::duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  ASSIGN_OR_RETURN(auto whole, tokenizer->Encode(big));
  double whole_s = std::chrono::duration<double>(Clock::now() - t0).count();

  std::printf("corolla bench tokenize: %s (load %.2f s), single thread\n", dir.c_str(), load_s);
  std::printf("  golden corpus: %zu texts x %lld passes, %.2f MB, %zu tokens: %.1f MB/s\n",
              golden.size(), static_cast<long long>(golden_repeats), golden_bytes / 1e6,
              golden_tokens, golden_bytes / 1e6 / golden_s);
  std::printf("  generated text (checksum %08x, %zu bytes) in %zu chunks, %zu tokens: %.1f MB/s\n",
              Fnv1a(big), big.size(), chunks.size(), big_tokens, big.size() / 1e6 / big_s);
  std::printf("  generated text as one string, %zu tokens: %.1f MB/s\n", whole.size(),
              big.size() / 1e6 / whole_s);
  return Status::Ok();
}

}  // namespace

int BenchTokenizeMain(int argc, char** argv) {
  bool help = false;
  return ReportStatus("bench tokenize", Bench(argc, argv, &help));
}

}  // namespace corolla::cli
