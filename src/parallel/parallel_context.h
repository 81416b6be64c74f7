// ParallelContext: one process's place in a multi-GPU job and the communicators of its groups.
// Created once per process after the backend (the NCCL communicators run on its stream); the
// model keeps raw pointers to the communicators, so the context must outlive the model.
// Single-threaded, like the backend.
#pragma once

#include <memory>

#include "kernels/backend.h"
#include "parallel/communicator.h"
#include "parallel/rank_layout.h"
#include "parallel/tcp_store.h"

namespace corolla {

class ParallelContext {
 public:
  // Connects to the job's other ranks through env.master_addr/port, and creates one
  // communicator per group this layout needs (TP; EP when it differs from TP). On the CPU a
  // group smaller than the world (TP under --dp) runs over a TcpStore of its own.
  static Result<std::unique_ptr<ParallelContext>> Create(const ParallelConfig& config, const ProcessEnv& env,
                                                         Backend& backend);

  const RankLayout& layout() const { return layout_; }
  TcpStore& store() { return *store_; }
  // nullptr when the group has one rank.
  Communicator* tp() const { return tp_.get(); }
  Communicator* ep() const { return ep_ ? ep_.get() : tp_.get(); }

 private:
  RankLayout layout_;
  std::unique_ptr<TcpStore> store_;
  std::unique_ptr<Communicator> tp_;
  std::unique_ptr<Communicator> ep_;  // only when the EP group is not the TP group
};

}  // namespace corolla
