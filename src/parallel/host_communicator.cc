#include <cstring>

#include "base/numeric.h"
#include "parallel/communicator.h"

namespace corolla {
namespace {

class HostCommunicator final : public Communicator {
 public:
  HostCommunicator(TcpStore& store, int size, int rank) : store_(store), size_(size), rank_(rank) {}
  int size() const override { return size_; }
  int rank() const override { return rank_; }
  std::string name() const override { return "host"; }

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

 private:
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

}  // namespace corolla
