// corolla bench WHAT: the benchmarks. Each prints what it measured, the limit or peer it is
// compared with, and the ratio.
#include <cstdio>
#include <string>

#include "cli/commands.h"

namespace corolla::cli {
namespace {

struct Benchmark {
  const char* name;
  int (*main)(int, char**);
  const char* summary;
};

constexpr Benchmark kBenchmarks[] = {
    {"tokenize", BenchTokenizeMain, "single-threaded encoding MB/s of a tokenizer"},
    {"decode", BenchDecodeMain, "one decode step of a model vs the HBM copy bandwidth"},
    {"prefill", BenchPrefillMain, "one prefill of a model vs the bf16 matmul peak"},
    {"serve", BenchServeMain, "an OpenAI server's throughput and TTFT/TPOT/ITL under load (like vllm bench serve)"},
};

void PrintUsage(FILE* out) {
  std::fprintf(out, "usage: corolla bench WHAT [options]\n\nbenchmarks:\n");
  for (const auto& b : kBenchmarks) std::fprintf(out, "  %-10s %s\n", b.name, b.summary);
  std::fprintf(out, "\n'corolla bench WHAT --help' explains the options of each.\n");
}

}  // namespace

int BenchMain(int argc, char** argv) {
  if (argc < 3) {
    PrintUsage(stderr);
    return 2;
  }
  std::string what = argv[2];
  if (what == "--help" || what == "-h") {
    PrintUsage(stdout);
    return 0;
  }
  for (const auto& b : kBenchmarks)
    if (what == b.name) return b.main(argc, argv);
  std::fprintf(stderr, "corolla bench: unknown benchmark '%s'\n\n", what.c_str());
  PrintUsage(stderr);
  return 2;
}

}  // namespace corolla::cli
