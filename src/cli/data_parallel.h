// Data parallelism in the commands that run a model over several sequences (logits, generate;
// serve's rounds are engine/dp_engine.h, over DpRoundExchange here): which of the input's
// sequences a rank takes (every dp-th), the gathering of per-sequence results on rank 0, and
// keeping the ranks in step. Under DP-EP every model forward is
// collective (each MoE layer exchanges tokens with all EP ranks), so all ranks run the same
// number of forwards and a rank without work runs empty ones (Model: a batch of zero tokens).
// Used by the command's one thread.
#pragma once

#include <string>
#include <vector>

#include "cli/model_options.h"
#include "engine/dp_engine.h"  // CountingModel
#include "engine/engine.h"

namespace corolla::cli {

// The indices of the sequences this rank takes out of `num_sequences`: i % dp == dp_rank (all
// of them for one process, or when every rank holds the same sequences, as under TP alone).
std::vector<int> SequencesOfThisRank(int num_sequences, const LoadedModel& m);
bool IsDataParallel(const LoadedModel& m);
// Data parallel with the experts split over all ranks: every forward is collective.
bool IsDpEp(const LoadedModel& m);

// Every DP rank's `blob`, indexed by DP rank, on every rank; {blob} without data parallelism.
Result<std::vector<std::string>> GatherFromDpRanks(const LoadedModel& m, const std::string& blob);

// Under DP-EP, one forward of no tokens: it joins every MoE layer's exchanges. Otherwise nothing.
void RunEmptyForward(Model& model, const LoadedModel& m);

// The all-gather of DP serving's rounds (engine/dp_engine.h): GatherFromDpRanks over the
// TcpStore of `parallel`, which must outlive its use.
DpAllGather DpRoundExchange(ParallelContext& parallel);

// Steps `engine` (built on `model`, which wraps m.model) until every DP rank's engine is done.
// Each round, all ranks learn whether any still has work (one host all-gather); a rank whose
// engine is done, or whose step ran no forward, runs an empty one, so every rank makes exactly
// one forward per round. Needs the engine's decode graphs off (their warm-up forwards would
// be extra): COROLLA_CUDA_GRAPHS=0 before the engine is made.
Status StepInLockstep(Engine& engine, CountingModel& model, const LoadedModel& m);

}  // namespace corolla::cli
