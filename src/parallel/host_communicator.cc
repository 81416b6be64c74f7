#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "base/numeric.h"
#include "parallel/communicator.h"

namespace corolla {
namespace {

// Bytes of one row (one slice of dim 0) of a tensor, from its shape (the tensor may have no rows).
int64_t RowBytes(const TensorView& x) {
  int64_t n = DTypeSize(x.dtype);
  for (int i = 1; i < x.rank(); ++i) n *= x.dim(i);
  return n;
}

class HostCommunicator final : public Communicator {
 public:
  HostCommunicator(TcpStore& store, int size, int rank) : store_(store), size_(size), rank_(rank) {}
  // A sub-group's communicator, over its own store.
  explicit HostCommunicator(std::unique_ptr<TcpStore> own)
      : own_store_(std::move(own)), store_(*own_store_), size_(store_.world_size()), rank_(store_.rank()) {}
  int size() const override { return size_; }
  int rank() const override { return rank_; }
  std::string name() const override { return own_store_ ? "host group" : "host"; }

  void AllReduceSum(const TensorView& x) override {
    COROLLA_CHECK(x.device == Device::kCpu && x.is_contiguous() && x.dtype == DType::kF32)
        << "host all-reduce of " << x.ToString();
    std::string mine(static_cast<const char*>(x.data), x.nbytes());
    Result<std::vector<std::string>> all = store_.AllGather(mine);
    COROLLA_CHECK(all.ok()) << "host all-reduce: " << all.status().ToString();
    float* out = x.ptr<float>();
    const int64_t n = x.numel();
    std::fill_n(out, n, 0.0f);
    for (const std::string& part : *all) {
      COROLLA_CHECK_EQ(static_cast<int64_t>(part.size()), x.nbytes());
      const float* p = reinterpret_cast<const float*>(part.data());
      for (int64_t i = 0; i < n; ++i) out[i] += p[i];
    }
  }

  // Correctness over speed: every rank's whole send buffer travels to every rank through the
  // store's AllGather (a blob of [send_counts as int64][rows]), and each takes its part.
  void AllToAllV(const TensorView& send, std::span<const int64_t> send_counts, const TensorView& recv,
                 std::span<const int64_t> recv_counts) override {
    COROLLA_CHECK(send.device == Device::kCpu && recv.device == Device::kCpu && send.is_contiguous() &&
                  recv.is_contiguous() && static_cast<int>(send_counts.size()) == size_ &&
                  static_cast<int>(recv_counts.size()) == size_)
        << "host all-to-all of " << send.ToString() << " into " << recv.ToString();
    const int64_t num_send = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
    const int64_t num_recv = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
    COROLLA_CHECK(send.dim(0) >= num_send && recv.dim(0) >= num_recv)
        << "all-to-all: " << num_send << " rows to send from " << send.ToString() << ", " << num_recv
        << " to receive into " << recv.ToString();
    const int64_t row_bytes = RowBytes(send);
    COROLLA_CHECK(RowBytes(recv) == row_bytes)
        << "all-to-all rows of " << send.ToString() << " and " << recv.ToString() << " differ";
    std::string blob(size_ * sizeof(int64_t) + num_send * row_bytes, '\0');
    std::memcpy(blob.data(), send_counts.data(), size_ * sizeof(int64_t));
    if (num_send > 0) std::memcpy(blob.data() + size_ * sizeof(int64_t), send.data, num_send * row_bytes);
    Result<std::vector<std::string>> all = store_.AllGather(blob);
    COROLLA_CHECK(all.ok()) << "host all-to-all: " << all.status().ToString();
    char* out = static_cast<char*>(recv.data);
    for (int p = 0; p < size_; ++p) {
      const std::string& part = (*all)[p];
      std::vector<int64_t> counts(size_);
      COROLLA_CHECK(part.size() >= size_ * sizeof(int64_t));
      std::memcpy(counts.data(), part.data(), size_ * sizeof(int64_t));
      COROLLA_CHECK_EQ(counts[rank_], recv_counts[p]) << "rows from rank " << p << " to rank " << rank_;
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      const int64_t before = std::accumulate(counts.begin(), counts.begin() + rank_, int64_t{0});
      COROLLA_CHECK_EQ(static_cast<int64_t>(part.size()), static_cast<int64_t>(size_ * sizeof(int64_t)) + total * row_bytes)
          << "rank " << p << "'s rows are not " << row_bytes << " bytes";
      const int64_t n = counts[rank_] * row_bytes;
      if (n > 0) std::memcpy(out, part.data() + size_ * sizeof(int64_t) + before * row_bytes, n);
      out += n;
    }
  }

 private:
  std::unique_ptr<TcpStore> own_store_;  // sub-groups only; declared before store_, which refers to it
  TcpStore& store_;
  int size_, rank_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> MakeHostCommunicator(TcpStore& store, int group_size, int group_rank) {
  if (group_size != store.world_size())
    return Unsupported("the CPU backend's collectives span the whole world (group of " + std::to_string(group_size) +
                       " in a world of " + std::to_string(store.world_size()) + "); use --device cuda");
  return std::unique_ptr<Communicator>(new HostCommunicator(store, group_size, group_rank));
}

Result<std::unique_ptr<Communicator>> MakeHostGroupCommunicator(TcpStore& store, const std::vector<int>& ranks,
                                                                const std::string& master_addr) {
  const int size = static_cast<int>(ranks.size());
  const auto me = std::find(ranks.begin(), ranks.end(), store.rank());
  COROLLA_CHECK(me != ranks.end() && size >= 1) << "rank " << store.rank() << " outside its group";
  const int group_rank = static_cast<int>(me - ranks.begin());
  if (size == store.world_size()) return MakeHostCommunicator(store, size, group_rank);
  // The group's first rank listens before the AllGather, so the others' connects wait in its
  // backlog until it accepts them.
  std::unique_ptr<TcpStore> own;
  std::string where;
  if (group_rank == 0) {
    ASSIGN_OR_RETURN(own, TcpStore::ListenForGroup(size));
    where = (store.rank() == 0 ? master_addr : store.local_address()) + " " + std::to_string(own->port());
  }
  ASSIGN_OR_RETURN(std::vector<std::string> all, store.AllGather(where));
  if (group_rank == 0) {
    if (size > 1) RETURN_IF_ERROR(own->AcceptPeers());
  } else {
    const std::string& leader = all[ranks[0]];
    const size_t space = leader.find(' ');
    if (space == std::string::npos || space == 0)
      return Internal("host group: rank " + std::to_string(ranks[0]) + " published no address ('" + leader + "')");
    ASSIGN_OR_RETURN(own, TcpStore::Connect(leader.substr(0, space), std::stoi(leader.substr(space + 1)), size,
                                            group_rank));
  }
  return std::unique_ptr<Communicator>(new HostCommunicator(std::move(own)));
}

}  // namespace corolla
