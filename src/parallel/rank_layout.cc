#include "parallel/rank_layout.h"

#include <cstdlib>

namespace corolla {
namespace {

// An integer environment variable; `fallback` when unset.
Result<int> EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > (1 << 20))
    return InvalidArgument(std::string("environment variable ") + name + "='" + v + "' is not a non-negative integer");
  return static_cast<int>(x);
}

std::vector<int> Range(int first, int count, int stride) {
  std::vector<int> r;
  for (int i = 0; i < count; ++i) r.push_back(first + i * stride);
  return r;
}

}  // namespace

Result<ProcessEnv> ReadProcessEnv() {
  ProcessEnv env;
  env.from_env = std::getenv("RANK") != nullptr && std::getenv("WORLD_SIZE") != nullptr;
  if (!env.from_env) return env;
  ASSIGN_OR_RETURN(env.world_size, EnvInt("WORLD_SIZE", 1));
  ASSIGN_OR_RETURN(env.rank, EnvInt("RANK", 0));
  ASSIGN_OR_RETURN(env.local_rank, EnvInt("LOCAL_RANK", env.rank));
  ASSIGN_OR_RETURN(env.master_port, EnvInt("MASTER_PORT", 29500));
  if (const char* a = std::getenv("MASTER_ADDR"); a != nullptr && *a != '\0') env.master_addr = a;
  if (env.world_size < 1 || env.rank >= env.world_size)
    return InvalidArgument("RANK=" + std::to_string(env.rank) + " is outside WORLD_SIZE=" +
                           std::to_string(env.world_size));
  if (env.master_port < 1 || env.master_port > 65535)
    return InvalidArgument("MASTER_PORT=" + std::to_string(env.master_port) + " is not a TCP port");
  return env;
}

Result<RankLayout> RankLayout::Make(const ParallelConfig& config, int world_size, int rank, int local_rank) {
  const int tp = config.tp, dp = config.dp, ep = config.ep == 0 ? config.tp : config.ep;
  if (tp < 1 || dp < 1 || ep < 1) return InvalidArgument("--tp, --ep and --dp must be positive");
  if (tp * dp != world_size)
    return InvalidArgument("--tp " + std::to_string(tp) + " x --dp " + std::to_string(dp) +
                           " must equal the world size " + std::to_string(world_size));
  if (ep != tp && ep != tp * dp)
    return InvalidArgument("--ep " + std::to_string(ep) + " must equal --tp (" + std::to_string(tp) +
                           ") or --tp x --dp (" + std::to_string(tp * dp) + ")");
  if (rank < 0 || rank >= world_size) return InvalidArgument("rank " + std::to_string(rank) + " outside the world");
  RankLayout l;
  l.world_size = world_size;
  l.rank = rank;
  l.local_rank = local_rank;
  l.tp_size = tp;
  l.tp_rank = rank % tp;
  l.dp_size = dp;
  l.dp_rank = rank / tp;
  l.ep_size = ep;
  l.ep_rank = rank % ep;
  return l;
}

std::vector<int> RankLayout::TpGroup() const { return Range(dp_rank * tp_size, tp_size, 1); }
std::vector<int> RankLayout::DpGroup() const { return Range(tp_rank, dp_size, tp_size); }
std::vector<int> RankLayout::EpGroup() const { return Range(rank - ep_rank, ep_size, 1); }

std::string RankLayout::ToString() const {
  auto frac = [](int r, int n) { return std::to_string(r) + "/" + std::to_string(n); };
  return "rank " + frac(rank, world_size) + " (tp " + frac(tp_rank, tp_size) + ", dp " + frac(dp_rank, dp_size) +
         ", ep " + frac(ep_rank, ep_size) + ")";
}

}  // namespace corolla
