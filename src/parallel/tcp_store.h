// TcpStore: the bootstrap of a job's processes, over one TCP star centred on rank 0 at
// MASTER_ADDR:MASTER_PORT. It exchanges small blobs (NCCL unique ids, host tensors of the CPU
// backend's collectives) with world-wide AllGather; every rank must call the same sequence of
// AllGathers. A sub-group (the CPU backend's TP group under DP x TP) gets a store of its own, a
// star on the group's first rank (ListenForGroup and AcceptPeers there, Connect elsewhere), so groups run
// collectives concurrently without mixing. Not thread-safe: one thread per process uses it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace corolla {

class TcpStore {
 public:
  // Rank 0 listens on `port` and accepts world_size - 1 peers; the others connect to
  // addr:port, retrying until `timeout_s` has passed.
  static Result<std::unique_ptr<TcpStore>> Connect(const std::string& addr, int port, int world_size,
                                                   int rank, double timeout_s = 120);
  // Connect split in two for a sub-group: the group's rank 0 listens on a free port (reported by
  // port(), handed to the others over the world store), then accepts the group's other ranks.
  static Result<std::unique_ptr<TcpStore>> ListenForGroup(int world_size);
  Status AcceptPeers();
  int port() const { return port_; }
  // This process's address as rank 0 of the store sees it (IPv4 text); empty on rank 0.
  std::string local_address() const;
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // Every rank's `blob`, indexed by rank.
  Result<std::vector<std::string>> AllGather(const std::string& blob);
  Status Barrier();

 private:
  TcpStore(int world_size, int rank) : world_size_(world_size), rank_(rank) {}
  static Result<std::unique_ptr<TcpStore>> Listen(int port, int world_size);  // rank 0's socket; port 0: any

  int world_size_;
  int rank_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::vector<int> peers_;  // rank 0: socket of each rank (peers_[0] unused); others: peers_[0] = rank 0
};

}  // namespace corolla
