// The subcommands of the `corolla` binary; each returns the process exit code.
// main.cc holds the table that maps names to these.
#pragma once

namespace corolla::cli {

int GenerateMain(int argc, char** argv);    // generate_cmd.cc
int LogitsMain(int argc, char** argv);      // logits_cmd.cc
int TokenizeMain(int argc, char** argv);    // tokenize_cmd.cc
int DetokenizeMain(int argc, char** argv);  // tokenize_cmd.cc
int ServeMain(int argc, char** argv);       // serve_cmd.cc
int BenchMain(int argc, char** argv);       // bench_cmd.cc: dispatches `bench WHAT`
int BenchTokenizeMain(int argc, char** argv);  // bench_tokenize_cmd.cc
int BenchDecodeMain(int argc, char** argv);    // bench_model_cmd.cc
int BenchPrefillMain(int argc, char** argv);   // bench_model_cmd.cc
int BenchServeMain(int argc, char** argv);     // bench_serve_cmd.cc

}  // namespace corolla::cli
