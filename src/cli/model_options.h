// Options shared by the commands that load a model (--model, --device, --threads, --tp, --dp,
// --ep, --linear-state-dtype, --fp8; serve and bench serve also --config/--random-weights/--layers),
// and the lookup of the built-in default model. With --tp N --dp D the process is one rank of
// N x D (RANK etc. in the environment, from parallel/launcher.h or an outside launcher).
#pragma once

#include <memory>
#include <string>

#include "cli/flags.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "parallel/parallel_context.h"

namespace corolla::cli {

// "f32" or "bf16" (the values of --linear-state-dtype).
Result<DType> ParseLinearStateDtype(const std::string& name);

struct ModelOptions {
  std::string model;  // empty: the built-in default model
  std::string device = "cpu";
  int64_t threads = 0;
  int64_t tp = 1;  // tensor parallel ranks (experts expert-parallel over the same ranks)
  int64_t dp = 1;  // data-parallel ranks: each owns its share of the sequences and its KV cache
  int64_t ep = 0;  // expert-parallel ranks: 0 or tp (TP-EP), or dp x tp (DP-EP: tokens move to experts)
  std::string linear_state_dtype = "f32";  // hybrids: storage of the recurrent state, f32 or bf16
  // FP8 checkpoints: "native" (block-scaled FP8 GEMMs), "dequant" (bf16 weights), or empty:
  // native on cuda, dequant on cpu. Passed to the loader as COROLLA_FP8 (model/weights.h).
  std::string fp8;
  // Random weights of a real shape, no checkpoint needed (model/random_weights.h): the shape
  // from `config` (else --model's config.json), truncated to `layers` (0: all). Without --model
  // there is no tokenizer: the server then takes token-id prompts only.
  bool random_weights = false;
  std::string config;
  int64_t layers = 0;
  int64_t seed = 1;
  // DP-EP exchanges (set by commands, not flags): ModelShard::ep_capacity / ep_sized_fallback.
  int ep_capacity = 0;
  bool ep_sized_fallback = false;

  void Declare(Flags& flags);
  ParallelConfig parallel() const {
    return {static_cast<int>(tp), static_cast<int>(ep), static_cast<int>(dp)};
  }
  int world_size() const { return static_cast<int>(tp * dp); }
  // --linear-state-dtype as a DType (an error names the flag unless it is f32 or bf16).
  Result<DType> LinearStateDtype() const { return ParseLinearStateDtype(linear_state_dtype); }
  void DeclareRandomWeights(Flags& flags);  // --random-weights, --config, --layers, --weight-seed
  // The model directory to load: --model, or the built-in demo model beside the binary or in
  // the source tree.
  Result<std::string> ModelDir() const;
};

struct LoadedModel {
  std::string dir;   // tokenizer and generation config; empty for random weights without --model
  std::string name;  // the default served name: the directory's or the config file's
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ParallelContext> parallel;  // null for one process; outlives the model
  std::unique_ptr<Model> model;
  // Whether this process prints results (rank 0 of a multi-rank job, or the only process).
  bool is_output_rank() const { return parallel == nullptr || parallel->layout().rank == 0; }
};

// Creates the backend and loads the model, logging what it does.
Result<LoadedModel> LoadModelFromOptions(const ModelOptions& options);

// One process's backend and place among the ranks of `config`: for more than one rank, its
// GPU (LOCAL_RANK) on CUDA, the parallel context (communicators) and the model shard to load.
// `ep_capacity` goes to the shard (DP-EP fixed-size exchanges; 0: sized per layer).
struct RankSetup {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ParallelContext> parallel;  // null for one process; must outlive the model
  ModelShard shard;
};
Result<RankSetup> SetUpRank(const std::string& device, const ParallelConfig& config, int ep_capacity = 0);

}  // namespace corolla::cli
