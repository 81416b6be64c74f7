// The one-node launcher: `corolla generate --tp 2 ...` started by hand becomes one process per
// GPU. The parent re-executes its own binary with the same arguments once per local rank, with
// RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT set (as torchrun, mpirun or Slurm
// would set them), waits for all, and exits with the first failure. Rank 0 keeps stdout; the
// other ranks' stdout goes to /dev/null, their stderr stays. SIGTERM/SIGINT go on to the ranks
// (a second one kills them); the launcher waits for them either way.
#pragma once

#include <optional>

namespace corolla {

// When world_size > 1 and this process is not already a rank (no RANK in the environment):
// spawns the ranks, waits, and returns the exit code to end with. Otherwise nullopt: this
// process is a rank (or the only process) and carries on.
std::optional<int> SpawnLocalRanks(int world_size, int argc, char** argv);

}  // namespace corolla
