// Options shared by the commands that load a model (--model, --device, --threads, --tp), and
// the lookup of the built-in default model. With --tp N the process is one rank of N (RANK etc.
// in the environment, from parallel/launcher.h or an outside launcher).
#pragma once

#include <memory>
#include <string>

#include "cli/flags.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "parallel/parallel_context.h"

namespace corolla::cli {

struct ModelOptions {
  std::string model;  // empty: the built-in default model
  std::string device = "cpu";
  int64_t threads = 0;
  int64_t tp = 1;  // tensor parallel ranks (experts expert-parallel over the same ranks)

  void Declare(Flags& flags);
  // The model directory to load: --model, or the built-in demo model beside the binary or in
  // the source tree.
  Result<std::string> ModelDir() const;
};

struct LoadedModel {
  std::string dir;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ParallelContext> parallel;  // null for one process; outlives the model
  std::unique_ptr<Model> model;
  // Whether this process prints results (rank 0 of a multi-rank job, or the only process).
  bool is_output_rank() const { return parallel == nullptr || parallel->layout().rank == 0; }
};

// Creates the backend and loads the model, logging what it does.
Result<LoadedModel> LoadModelFromOptions(const ModelOptions& options);

}  // namespace corolla::cli
