#include "cli/data_parallel.h"

namespace corolla::cli {

bool IsDataParallel(const LoadedModel& m) { return m.parallel != nullptr && m.parallel->layout().dp_size > 1; }

bool IsDpEp(const LoadedModel& m) {
  return IsDataParallel(m) && m.parallel->layout().ep_size > m.parallel->layout().tp_size;
}

std::vector<int> SequencesOfThisRank(int num_sequences, const LoadedModel& m) {
  const int dp = IsDataParallel(m) ? m.parallel->layout().dp_size : 1;
  const int dp_rank = IsDataParallel(m) ? m.parallel->layout().dp_rank : 0;
  std::vector<int> mine;
  for (int i = dp_rank; i < num_sequences; i += dp) mine.push_back(i);
  return mine;
}

namespace {

Result<std::vector<std::string>> GatherOver(ParallelContext& parallel, const std::string& blob) {
  ASSIGN_OR_RETURN(std::vector<std::string> all, parallel.store().AllGather(blob));
  const RankLayout& l = parallel.layout();
  std::vector<std::string> per_dp_rank;
  for (int r = 0; r < l.dp_size; ++r) per_dp_rank.push_back(std::move(all[r * l.tp_size]));  // tp rank 0 of each
  return per_dp_rank;
}

}  // namespace

Result<std::vector<std::string>> GatherFromDpRanks(const LoadedModel& m, const std::string& blob) {
  if (!IsDataParallel(m)) return std::vector<std::string>{blob};
  return GatherOver(*m.parallel, blob);
}

void RunEmptyForward(Model& model, const LoadedModel& m) {
  if (IsDpEp(m)) corolla::RunEmptyForward(model, m.backend->device());
}

DpAllGather DpRoundExchange(ParallelContext& parallel) {
  return [&parallel](const std::string& blob) { return GatherOver(parallel, blob); };
}

Status StepInLockstep(Engine& engine, CountingModel& model, const LoadedModel& m) {
  if (!IsDpEp(m)) {  // ranks without expert exchanges need not keep in step
    while (engine.HasUnfinished()) engine.Step();
    return Status::Ok();
  }
  while (true) {
    const bool busy = engine.HasUnfinished();
    ASSIGN_OR_RETURN(std::vector<std::string> all, m.parallel->store().AllGather(busy ? "1" : "0"));
    bool any = false;
    for (const std::string& s : all) any = any || s == "1";
    if (!any) return Status::Ok();
    const int64_t before = model.num_forwards();
    if (busy) engine.Step();
    const int64_t ran = model.num_forwards() - before;
    if (ran > 1) return Internal("an engine step ran " + std::to_string(ran) + " forwards; DP-EP needs one per round");
    if (ran == 0) RunEmptyForward(model, m);
  }
}

}  // namespace corolla::cli
