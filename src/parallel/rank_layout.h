// RankLayout: where one process sits among the ranks of a job, and the groups it belongs to.
// Ranks are ordered dp-major: rank = dp_rank * tp + tp_rank, so a TP group is tp consecutive
// ranks (one node's NVLink domain when tp <= GPUs per node). Experts are sharded over EP groups
// of ep consecutive ranks, ep = tp (prefill layout: TP-EP, inputs replicated) or ep = dp * tp
// (decode layout: DP attention + EP). Plain values; thread-safe to read.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace corolla {

// The parallel degrees a user asks for (--tp, --ep, --dp). ep 0: the same as tp.
struct ParallelConfig {
  int tp = 1;
  int ep = 0;
  int dp = 1;
  int world_size() const { return tp * dp; }
};

// What the launcher (ours, torchrun, mpirun, Slurm, a LeaderWorkerSet) put in the environment.
struct ProcessEnv {
  int world_size = 1;
  int rank = 0;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  bool from_env = false;  // RANK and WORLD_SIZE were set
};

// Reads WORLD_SIZE, RANK, LOCAL_RANK (default: RANK), MASTER_ADDR, MASTER_PORT. Without RANK,
// a single process (world 1). Errors name the variable that is malformed or out of range.
Result<ProcessEnv> ReadProcessEnv();

struct RankLayout {
  int world_size = 1, rank = 0, local_rank = 0;
  int tp_size = 1, tp_rank = 0;
  int dp_size = 1, dp_rank = 0;
  int ep_size = 1, ep_rank = 0;

  // Checks config against the world (tp * dp must equal it; ep must be tp or tp * dp).
  static Result<RankLayout> Make(const ParallelConfig& config, int world_size, int rank, int local_rank);

  // Global ranks of this rank's groups, in group-rank order.
  std::vector<int> TpGroup() const;
  std::vector<int> DpGroup() const;
  std::vector<int> EpGroup() const;
  std::string ToString() const;  // "rank 3/4 (tp 1/2, dp 1/2, ep 3/4)"
};

}  // namespace corolla
