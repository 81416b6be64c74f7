// corolla: the command-line entry point. Each subcommand parses its own options (flags.h).
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/commands.h"

namespace {

struct Command {
  const char* name;
  int (*main)(int, char**);
  const char* summary;
};

constexpr Command kCommands[] = {
    {"generate", corolla::cli::GenerateMain, "generate tokens from a prompt"},
    {"logits", corolla::cli::LogitsMain, "write float32 logits of every position to safetensors"},
    {"tokenize", corolla::cli::TokenizeMain, "text (or a chat) on stdin to token ids"},
    {"detokenize", corolla::cli::DetokenizeMain, "token ids on stdin to text"},
    {"serve", corolla::cli::ServeMain, "serve a model over an OpenAI-compatible HTTP API"},
    {"bench", corolla::cli::BenchMain, "benchmarks: bench tokenize"},
};

void PrintUsage(FILE* out) {
  std::fprintf(out,
               "usage: corolla COMMAND [options]\n\n"
               "Corolla serves Mixture-of-Experts language models from Hugging Face checkpoints.\n\n"
               "commands:\n");
  for (const auto& c : kCommands) std::fprintf(out, "  %-12s %s\n", c.name, c.summary);
  std::fprintf(out, "\n'corolla COMMAND --help' explains the options of each command.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    PrintUsage(stderr);
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    PrintUsage(stdout);
    return 0;
  }
  for (const auto& c : kCommands)
    if (cmd == c.name) return c.main(argc, argv);
  std::fprintf(stderr, "corolla: unknown command '%s'\n\n", cmd.c_str());
  PrintUsage(stderr);
  return 2;
}
