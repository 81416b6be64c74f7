// Options shared by the commands that load a model (--model, --device, --threads), and the
// lookup of the built-in default model.
#pragma once

#include <memory>
#include <string>

#include "cli/flags.h"
#include "kernels/backend.h"
#include "model/model.h"

namespace corolla::cli {

struct ModelOptions {
  std::string model;  // empty: the built-in default model
  std::string device = "cpu";
  int64_t threads = 0;

  void Declare(Flags& flags);
  // The model directory to load: --model, or the built-in demo model beside the binary or in
  // the source tree.
  Result<std::string> ModelDir() const;
};

struct LoadedModel {
  std::string dir;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

// Creates the backend and loads the model, logging what it does.
Result<LoadedModel> LoadModelFromOptions(const ModelOptions& options);

}  // namespace corolla::cli
