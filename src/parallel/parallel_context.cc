#include "parallel/parallel_context.h"

#include <cstdlib>

#include "base/logging.h"
#include "parallel/cuda/nccl_communicator.h"

namespace corolla {
namespace {

// A communicator for the group `ranks` (global ranks; this rank among them). With NCCL, the
// group's first rank makes the unique id and one world-wide AllGather hands it to the others:
// every rank takes part, in or out of the group, so all ranks call this in the same order. On
// the CPU backend, a host communicator over a store of the group's own (the world's for the
// whole world), whose address travels the same way.
Result<std::unique_ptr<Communicator>> MakeGroup(TcpStore& store, Backend& backend, const std::vector<int>& ranks,
                                                int my_rank, int local_rank, const std::string& master_addr) {
  int group_rank = -1;
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == my_rank) group_rank = static_cast<int>(i);
  COROLLA_CHECK(group_rank >= 0);
  if (backend.device() == Device::kCpu) return MakeHostGroupCommunicator(store, ranks, master_addr);
#ifdef COROLLA_HAVE_CUDA
  const int size = static_cast<int>(ranks.size());
  std::string id;
  if (group_rank == 0) {
    ASSIGN_OR_RETURN(id, NcclUniqueId());
  }
  ASSIGN_OR_RETURN(std::vector<std::string> ids, store.AllGather(id));
  return MakeNcclCommunicator(backend, local_rank, ids[ranks[0]], size, group_rank);
#else
  return Unsupported("multi-GPU groups need a CUDA build");
#endif
}

}  // namespace

Result<std::unique_ptr<ParallelContext>> ParallelContext::Create(const ParallelConfig& config, const ProcessEnv& env,
                                                                 Backend& backend) {
  // Never NVLink multicast (NVLS) on these machines, whatever the caller's environment says.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  auto ctx = std::unique_ptr<ParallelContext>(new ParallelContext());
  ASSIGN_OR_RETURN(ctx->layout_, RankLayout::Make(config, env.world_size, env.rank, env.local_rank));
  ASSIGN_OR_RETURN(ctx->store_, TcpStore::Connect(env.master_addr, env.master_port, env.world_size, env.rank));
  const RankLayout& l = ctx->layout_;
  if (l.tp_size > 1) {
    ASSIGN_OR_RETURN(ctx->tp_, MakeGroup(*ctx->store_, backend, l.TpGroup(), l.rank, l.local_rank, env.master_addr));
  }
  if (l.ep_size != l.tp_size && l.ep_size > 1) {
    ASSIGN_OR_RETURN(ctx->ep_, MakeGroup(*ctx->store_, backend, l.EpGroup(), l.rank, l.local_rank, env.master_addr));
  }
  RETURN_IF_ERROR(ctx->store_->Barrier());
  LOG(DEBUG) << l.ToString() << ": groups ready (" << (ctx->tp_ ? ctx->tp_->name() : "no tp") << ")";
  return ctx;
}

}  // namespace corolla
