// The parallel layer on the CPU: rank layout and environment, the TCP bootstrap, the host
// all-to-alls and the DP-EP token exchange against references (ranks as threads), and tensor /
// expert / data parallelism end to end through the launcher (`corolla logits --tp N` and
// `--dp D --ep D` against one process on the fixtures; TP 4 replicates their 2 KV heads; on the
// DeepSeek-V3 fixtures TP splits the MLA heads, and on the FP8 one its shards cut 128 x 128
// scale blocks). The NCCL path runs on GPUs (scripts/gpu_run_multi.sh).
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <thread>

#include "model/safetensors.h"
#include "parallel/communicator.h"
#include "parallel/expert_parallel.h"
#include "parallel/rank_layout.h"
#include "parallel/run_corolla.h"
#include "parallel/tcp_store.h"

namespace corolla {
namespace {

TEST(AllReduceAlgo, NamesRoundTrip) {
  for (AllReduceAlgo a : {AllReduceAlgo::kAuto, AllReduceAlgo::kNccl, AllReduceAlgo::kOneShot, AllReduceAlgo::kTwoShot})
    EXPECT_EQ(ParseAllReduceAlgo(AllReduceAlgoName(a)), a);
  EXPECT_FALSE(ParseAllReduceAlgo("one-shot").has_value());
  EXPECT_FALSE(ParseAllReduceAlgo("").has_value());
}

TEST(RankLayout, PrefillLayoutTpEqualsEp) {
  auto l = RankLayout::Make({2, 0, 1}, 2, 1, 1);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->tp_rank, 1);
  EXPECT_EQ(l->ep_size, 2);
  EXPECT_EQ(l->ep_rank, 1);
  EXPECT_EQ(l->TpGroup(), (std::vector<int>{0, 1}));
  EXPECT_EQ(l->DpGroup(), (std::vector<int>{1}));
}

TEST(RankLayout, DecodeLayoutDpTimesTp) {
  // 8 ranks: 4 DP replicas of TP 2, experts over all 8.
  auto l = RankLayout::Make({2, 8, 4}, 8, 5, 5);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->tp_rank, 1);
  EXPECT_EQ(l->dp_rank, 2);
  EXPECT_EQ(l->ep_rank, 5);
  EXPECT_EQ(l->TpGroup(), (std::vector<int>{4, 5}));
  EXPECT_EQ(l->DpGroup(), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(l->EpGroup(), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(l->ToString(), "rank 5/8 (tp 1/2, dp 2/4, ep 5/8)");
}

TEST(RankLayout, ErrorsNameTheMismatch) {
  auto a = RankLayout::Make({2, 0, 1}, 4, 0, 0);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().ToString().find("world size 4"), std::string::npos) << a.status().ToString();
  auto b = RankLayout::Make({2, 3, 2}, 4, 0, 0);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().ToString().find("--ep 3"), std::string::npos) << b.status().ToString();
}

TEST(ProcessEnv, ReadsTheLauncherVariables) {
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  auto single = ReadProcessEnv();
  ASSERT_TRUE(single.ok());
  EXPECT_FALSE(single->from_env);
  EXPECT_EQ(single->world_size, 1);
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("MASTER_ADDR", "10.0.0.7", 1);
  setenv("MASTER_PORT", "29611", 1);
  auto env = ReadProcessEnv();
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  EXPECT_TRUE(env->from_env);
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->master_addr, "10.0.0.7");
  EXPECT_EQ(env->master_port, 29611);
  setenv("RANK", "4", 1);
  auto bad = ReadProcessEnv();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("RANK=4"), std::string::npos) << bad.status().ToString();
  setenv("RANK", "x", 1);
  EXPECT_FALSE(ReadProcessEnv().ok());
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(v);
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  return ntohs(sa.sin_port);
}

TEST(TcpStore, AllGatherAcrossThreeRanks) {
  const int port = FreePort(), world = 3;
  std::vector<std::vector<std::string>> got(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      auto store = TcpStore::Connect("127.0.0.1", port, world, r, 20);
      if (!store.ok()) {
        errors[r] = store.status().ToString();
        return;
      }
      // A large blob from rank 1 and an empty one from rank 2, twice.
      for (int round = 0; round < 2; ++round) {
        std::string blob = r == 1 ? std::string(1 << 20, static_cast<char>('a' + round)) : r == 0 ? "zero" : "";
        auto all = (*store)->AllGather(blob);
        if (!all.ok()) {
          errors[r] = all.status().ToString();
          return;
        }
        got[r] = *all;
      }
      if (Status s = (*store)->Barrier(); !s.ok()) errors[r] = s.ToString();
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    ASSERT_EQ(got[r].size(), 3u);
    EXPECT_EQ(got[r][0], "zero");
    EXPECT_EQ(got[r][1], std::string(1 << 20, 'b'));
    EXPECT_EQ(got[r][2], "");
  }
}

// Runs body(rank, communicator) on `world` threads, each a rank with its own TcpStore and host
// communicator; returns the first error.
std::string RunRanks(int world, const std::function<void(int, Communicator&)>& body) {
  const int port = FreePort();
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      auto store = TcpStore::Connect("127.0.0.1", port, world, r, 20);
      if (!store.ok()) {
        errors[r] = store.status().ToString();
        return;
      }
      auto comm = MakeHostCommunicator(**store, world, r);
      if (!comm.ok()) {
        errors[r] = comm.status().ToString();
        return;
      }
      body(r, **comm);
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r)
    if (!errors[r].empty()) return "rank " + std::to_string(r) + ": " + errors[r];
  return "";
}

// counts[src][dst]: rows rank src sends rank dst. Random (zeros included), then everything to
// rank 0, then nothing at all.
std::vector<std::vector<int64_t>> CountMatrix(int world, int round) {
  std::mt19937 rng(1234 + round);
  std::vector<std::vector<int64_t>> c(world, std::vector<int64_t>(world, 0));
  for (int a = 0; a < world; ++a)
    for (int b = 0; b < world; ++b) {
      if (round == 0) c[a][b] = rng() % 3 == 0 ? 0 : rng() % 7;
      if (round == 1) c[a][b] = b == 0 ? 1 + rng() % 5 : 0;
    }
  return c;
}

// Row i of what rank src sends rank dst: 3 values naming it.
void FillRow(float* row, int src, int dst, int64_t i) {
  row[0] = static_cast<float>(src);
  row[1] = static_cast<float>(dst);
  row[2] = static_cast<float>(i) + 0.5f;
}

TEST(HostCommunicator, AllToAllVMatchesTheReference) {
  for (int world : {2, 3, 4}) {
    for (int round = 0; round < 3; ++round) {
      const auto counts = CountMatrix(world, round);
      std::vector<std::string> wrong(world);
      std::string error = RunRanks(world, [&](int r, Communicator& comm) {
        std::vector<int64_t> send_counts = counts[r], recv_counts(world);
        int64_t num_send = 0, num_recv = 0;
        for (int p = 0; p < world; ++p) {
          recv_counts[p] = counts[p][r];
          num_send += send_counts[p];
          num_recv += recv_counts[p];
        }
        Tensor send = Tensor::Empty(DType::kF32, {num_send, 3});
        int64_t row = 0;
        for (int p = 0; p < world; ++p)
          for (int64_t i = 0; i < send_counts[p]; ++i) FillRow(send.ptr<float>() + 3 * row++, r, p, i);
        Tensor recv = Tensor::Empty(DType::kF32, {num_recv, 3});
        std::fill_n(recv.ptr<float>(), recv.numel(), NAN);  // poisoned
        comm.AllToAllV(send, send_counts, recv, recv_counts);
        row = 0;
        for (int p = 0; p < world; ++p)
          for (int64_t i = 0; i < recv_counts[p]; ++i, ++row) {
            float expect[3];
            FillRow(expect, p, r, i);
            if (!std::equal(expect, expect + 3, recv.ptr<float>() + 3 * row))
              wrong[r] += " row " + std::to_string(row);
          }
        // Equal blocks: two rows for each peer.
        Tensor eq_send = Tensor::Empty(DType::kF32, {2 * world, 3}), eq_recv = Tensor::Empty(DType::kF32, {2 * world, 3});
        for (int p = 0; p < world; ++p)
          for (int i = 0; i < 2; ++i) FillRow(eq_send.ptr<float>() + 3 * (2 * p + i), r, p, i);
        comm.AllToAll(eq_send, eq_recv);
        for (int p = 0; p < world; ++p)
          for (int i = 0; i < 2; ++i) {
            float expect[3];
            FillRow(expect, p, r, i);
            if (!std::equal(expect, expect + 3, eq_recv.ptr<float>() + 3 * (2 * p + i)))
              wrong[r] += " equal-block row " + std::to_string(2 * p + i);
          }
      });
      ASSERT_EQ(error, "");
      for (int r = 0; r < world; ++r) EXPECT_EQ(wrong[r], "") << "world " << world << " round " << round << " rank " << r;
    }
  }
}

// DP-EP dispatch -> experts -> combine against the same sum on one rank. The "experts" scale
// a token by (global id + 1), so a wrong id, weight, row or rank shows in the output.

// The "experts" of the EP exchange tests on rank r: global expert g multiplies its token by
// (g + 1), so each received row's output is sum_k w_k (g_k + 1) x over this rank's ids.
Tensor HostExperts(const ExpertInputs& in, int r, int per_rank, int top_k, int64_t hidden) {
  Tensor expert_out = Tensor::Empty(DType::kF32, {in.rows(), hidden});
  for (int64_t j = 0; j < in.rows(); ++j) {
    float* o = expert_out.ptr<float>() + j * hidden;
    std::fill_n(o, hidden, 0.0f);
    for (int k = 0; k < top_k; ++k) {
      const int32_t local = in.topk_ids.ptr<int32_t>()[j * in.topk_ids.strides[0] + k];
      if (local < 0 || local >= per_rank) continue;
      const float scale = in.topk_weights.ptr<float>()[j * in.topk_weights.strides[0] + k] *
                          static_cast<float>(r * per_rank + local + 1);
      for (int h = 0; h < hidden; ++h) o[h] += scale * in.x.ptr<float>()[j * in.x.strides[0] + h];
    }
  }
  return expert_out;
}

TEST(EpExchange, MatchesOneRankForAnyTokenCounts) {
  const int world = 3, experts = 6, hidden = 8, top_k = 3, per_rank = experts / world;
  // Tokens per rank in each round: uneven, one rank empty, all on one rank, none at all.
  const std::vector<std::vector<int>> rounds = {{5, 1, 9}, {0, 4, 2}, {7, 0, 0}, {0, 0, 0}};
  for (int capacity : {0, 9}) {
    for (size_t round = 0; round < rounds.size(); ++round) {
      std::vector<double> err(world, 0);
      std::string error = RunRanks(world, [&](int r, Communicator& comm) {
        std::unique_ptr<Backend> cpu = MakeCpuBackend();
        std::unique_ptr<EpExchange> ex = MakeAllToAllEpExchange(*cpu, comm, {experts, capacity});
        const int64_t tokens = rounds[round][r];
        std::mt19937 rng(static_cast<uint32_t>(100 * round + r));
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        Tensor x = Tensor::Empty(DType::kF32, {tokens, hidden});
        Tensor ids = Tensor::Empty(DType::kI32, {tokens, top_k});
        Tensor w = Tensor::Empty(DType::kF32, {tokens, top_k});
        for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = u(rng);
        for (int64_t t = 0; t < tokens; ++t) {
          std::vector<int32_t> all = {0, 1, 2, 3, 4, 5};
          std::shuffle(all.begin(), all.end(), rng);  // distinct experts per token
          for (int k = 0; k < top_k; ++k) {
            ids.ptr<int32_t>()[t * top_k + k] = all[k];
            w.ptr<float>()[t * top_k + k] = u(rng);
          }
        }
        ExpertInputs in = ex->Dispatch(x, ids, w);
        Tensor expert_out = HostExperts(in, r, per_rank, top_k, hidden);
        Tensor out = Tensor::Empty(DType::kF32, {tokens, hidden});
        std::fill_n(out.ptr<float>(), out.numel(), NAN);  // poisoned
        ex->Combine(expert_out, out);
        for (int64_t t = 0; t < tokens; ++t)
          for (int h = 0; h < hidden; ++h) {
            double ref = 0;
            for (int k = 0; k < top_k; ++k)
              ref += w.ptr<float>()[t * top_k + k] * (ids.ptr<int32_t>()[t * top_k + k] + 1.0) * x.ptr<float>()[t * hidden + h];
            const double got = out.ptr<float>()[t * hidden + h];
            err[r] = std::isfinite(got) ? std::max(err[r], std::fabs(got - ref)) : INFINITY;
          }
      });
      ASSERT_EQ(error, "");
      for (int r = 0; r < world; ++r)
        EXPECT_LT(err[r], 1e-5) << "capacity " << capacity << " round " << round << " rank " << r;
    }
  }
}

// Host sub-groups (the CPU's TP groups under --dp): two groups of two in a world of four run
// different numbers of all-reduces at the same time, then one world-wide; nothing mixes.
TEST(HostCommunicator, SubGroupsRunConcurrently) {
  const int world = 4, port = FreePort();
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      auto store = TcpStore::Connect("127.0.0.1", port, world, r, 20);
      if (!store.ok()) {
        errors[r] = store.status().ToString();
        return;
      }
      const std::vector<int> group = r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
      auto tp = MakeHostGroupCommunicator(**store, group, "127.0.0.1");
      auto all = MakeHostGroupCommunicator(**store, {0, 1, 2, 3}, "127.0.0.1");
      if (!tp.ok() || !all.ok()) {
        errors[r] = (tp.ok() ? all.status() : tp.status()).ToString();
        return;
      }
      if ((*tp)->size() != 2 || (*tp)->rank() != r % 2 || (*all)->size() != 4 || (*all)->rank() != r) {
        errors[r] = "group ranks";
        return;
      }
      const int calls = r < 2 ? 3 : 1;  // group {0, 1} three all-reduces, group {2, 3} one
      for (int i = 0; i < calls; ++i) {
        Tensor x = Tensor::Empty(DType::kF32, {3});
        for (int j = 0; j < 3; ++j) x.ptr<float>()[j] = static_cast<float>(10 * r + j + i);
        (*tp)->AllReduceSum(x);
        const int base = 10 * (group[0] + group[1]);
        for (int j = 0; j < 3; ++j)
          if (x.ptr<float>()[j] != static_cast<float>(base + 2 * (j + i))) errors[r] += " tp call " + std::to_string(i);
      }
      Tensor y = Tensor::Empty(DType::kF32, {1});
      y.ptr<float>()[0] = static_cast<float>(r + 1);
      (*all)->AllReduceSum(y);
      if (y.ptr<float>()[0] != 10.0f) errors[r] += " world sum " + std::to_string(y.ptr<float>()[0]);
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(EpExchange, TpRowsOfRankCoverTheTokens) {
  // ceil(T / tp) rows each, in rank order; odd counts leave the last ranks fewer or none.
  const std::vector<std::tuple<int64_t, int, std::vector<std::pair<int64_t, int64_t>>>> cases = {
      {5, 2, {{0, 3}, {3, 5}}}, {1, 2, {{0, 1}, {1, 1}}}, {0, 2, {{0, 0}, {0, 0}}},
      {5, 4, {{0, 2}, {2, 4}, {4, 5}, {5, 5}}}, {8, 4, {{0, 2}, {2, 4}, {4, 6}, {6, 8}}}, {7, 1, {{0, 7}}}};
  for (const auto& [tokens, tp, want] : cases)
    for (int r = 0; r < tp; ++r) {
      const RowRange got = TpRowsOfRank(tokens, tp, r);
      EXPECT_EQ(got.begin, want[r].first) << tokens << " tokens, rank " << r << " of " << tp;
      EXPECT_EQ(got.end, want[r].second) << tokens << " tokens, rank " << r << " of " << tp;
    }
}

// DP x TP: four ranks, two replicas of two TP ranks holding the same tokens; each TP rank's
// Combine gives its rows' expert sums and zeros elsewhere, so the TP sum is the whole answer.
// Odd token counts (5 over 2), an idle replica, a replica of one token; sized and capacity.
TEST(EpExchange, TpSlicesSumToOneRank) {
  const int world = 4, tp = 2, experts = 8, hidden = 8, top_k = 3, per_rank = experts / world;
  const std::vector<std::vector<int>> rounds = {{5, 3}, {0, 5}, {1, 0}, {0, 0}};  // tokens per replica
  for (int capacity : {0, 5}) {
    for (size_t round = 0; round < rounds.size(); ++round) {
      std::vector<double> err(world, 0);
      std::string error = RunRanks(world, [&](int r, Communicator& comm) {
        std::unique_ptr<Backend> cpu = MakeCpuBackend();
        auto made = MakeEpExchange(*cpu, comm, {experts, capacity}, hidden, top_k, tp, r % tp);
        if (!made.ok()) {
          err[r] = INFINITY;
          return;
        }
        std::unique_ptr<EpExchange> ex = std::move(*made);
        const int replica = r / tp;
        const int64_t tokens = rounds[round][replica];
        std::mt19937 rng(static_cast<uint32_t>(100 * round + replica));  // the same tokens on a replica's ranks
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        Tensor x = Tensor::Empty(DType::kF32, {tokens, hidden});
        Tensor ids = Tensor::Empty(DType::kI32, {tokens, top_k});
        Tensor w = Tensor::Empty(DType::kF32, {tokens, top_k});
        for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = u(rng);
        for (int64_t t = 0; t < tokens; ++t) {
          std::vector<int32_t> all(experts);
          std::iota(all.begin(), all.end(), 0);
          std::shuffle(all.begin(), all.end(), rng);
          for (int k = 0; k < top_k; ++k) {
            ids.ptr<int32_t>()[t * top_k + k] = all[k];
            w.ptr<float>()[t * top_k + k] = u(rng);
          }
        }
        ExpertInputs in = ex->Dispatch(x, ids, w);
        Tensor expert_out = HostExperts(in, r, per_rank, top_k, hidden);
        Tensor out = Tensor::Empty(DType::kF32, {tokens, hidden});
        std::fill_n(out.ptr<float>(), out.numel(), NAN);  // poisoned
        ex->Combine(expert_out, out);
        const RowRange mine = TpRowsOfRank(tokens, tp, r % tp);
        for (int64_t t = 0; t < tokens; ++t)
          for (int h = 0; h < hidden; ++h) {
            double ref = 0;
            if (t >= mine.begin && t < mine.end)
              for (int k = 0; k < top_k; ++k)
                ref += w.ptr<float>()[t * top_k + k] * (ids.ptr<int32_t>()[t * top_k + k] + 1.0) *
                       x.ptr<float>()[t * hidden + h];
            const double got = out.ptr<float>()[t * hidden + h];
            err[r] = std::isfinite(got) ? std::max(err[r], std::fabs(got - ref)) : INFINITY;
          }
      });
      ASSERT_EQ(error, "");
      for (int r = 0; r < world; ++r)
        EXPECT_LT(err[r], 1e-5) << "capacity " << capacity << " round " << round << " rank " << r;
    }
  }
}

// Logits [L, V] of `ids` from `corolla logits` with `extra` arguments.
std::vector<float> RunLogits(const std::string& model, const std::string& ids, const std::string& extra) {
  const std::string out = ::testing::TempDir() + "parallel_logits_" + std::to_string(getpid()) + ".safetensors";
  const std::string cmd = std::string(COROLLA_BINARY) + " logits --device cpu --threads 1 --model " + model +
                          " --ids '" + ids + "' --out " + out + " " + extra;
  int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd;
  if (rc != 0) return {};
  auto file = SafetensorsFile::Open(out);
  EXPECT_TRUE(file.ok());
  if (!file.ok()) return {};
  TensorView v = (*file)->View(*(*file)->Find("logits"));
  std::vector<float> logits(v.ptr<float>(), v.ptr<float>() + v.numel());
  std::remove(out.c_str());
  return logits;
}

class TensorParallelCpu : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(TensorParallelCpu, LogitsEqualOneProcess) {
  const auto& [name, tp] = GetParam();
  const std::string model = "tests/data/models/" + name;
  const std::string ids = "3,141,59,265,358,979,323,846,264,338,327,950,288,419,716,939,937";
  std::vector<float> single = RunLogits(model, ids, "");
  std::vector<float> split = RunLogits(model, ids, "--tp " + std::to_string(tp));
  ASSERT_FALSE(single.empty());
  ASSERT_EQ(single.size(), split.size());
  double err = 0, scale = 0;
  for (size_t i = 0; i < single.size(); ++i) {
    ASSERT_TRUE(std::isfinite(split[i])) << i;
    err = std::max(err, static_cast<double>(std::fabs(single[i] - split[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(single[i])));
  }
  std::printf("%s --tp %d on the CPU: max |diff| %.2e of max|logit| %.2f (rel %.2e)\n", name.c_str(), tp, err, scale,
              err / scale);
  EXPECT_LT(err, 1e-5 * scale);
}

// DeepSeek-V3 (4 MLA heads, 16 / 8 experts): --tp 2 and 4 split the heads, MLPs and experts.
// In the FP8 fixture (128 x 128 scale blocks) the shards start inside blocks: q_b rows 96 (of
// 192), o_proj columns 64 and 32 (of 128), kv_b rows 64 (of 256), dense MLP 160 and 80 (of
// 320), shared expert 96 and 48 (of 192).
INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelCpu,
                         ::testing::Values(std::make_tuple("qwen3-dense", 2), std::make_tuple("qwen3-moe", 2),
                                           std::make_tuple("qwen3-dense", 4), std::make_tuple("qwen3-moe", 4),
                                           std::make_tuple("deepseek-v3", 2), std::make_tuple("deepseek-v3", 4),
                                           std::make_tuple("deepseek-v3-fp8", 2), std::make_tuple("deepseek-v3-fp8", 4)));

// --fp8 native (the CUDA default; here the CPU twin: activations quantised per 1x128) with TP:
// shards that start inside a 128 x 128 block are dequantised, the others stay FP8, so the split
// differs from one process by which projections quantise their activations. Bounded by the
// native path's own distance from the dequantised one (fp8_model_test: ~1e-1 worst).
TEST(TensorParallelCpu, Fp8NativeShards) {
  const std::string model = "tests/data/models/deepseek-v3-fp8";
  const std::string ids = "3,141,59,265,358,979,323,846,264,338,327,950,288,419,716,939,937";
  const std::vector<float> single = RunLogits(model, ids, "--fp8 native");
  ASSERT_FALSE(single.empty());
  for (int tp : {2, 4}) {
    const std::vector<float> split = RunLogits(model, ids, "--fp8 native --tp " + std::to_string(tp));
    ASSERT_EQ(single.size(), split.size());
    double err = 0, scale = 0;
    for (size_t i = 0; i < single.size(); ++i) {
      ASSERT_TRUE(std::isfinite(split[i])) << i;
      err = std::max(err, static_cast<double>(std::fabs(single[i] - split[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(single[i])));
    }
    std::printf("deepseek-v3-fp8 --fp8 native --tp %d on the CPU: max |diff| %.2e of max|logit| %.2f (rel %.2e)\n", tp,
                err, scale, err / scale);
    EXPECT_LT(err, 2e-1 * scale) << "--tp " << tp;
  }
}

TEST(TensorParallelCpu, UnsplittableShapesAreErrors) {
  // 4 query heads (Qwen3) / 4 MLA heads (DeepSeek-V3) do not split over 3 ranks: every rank
  // fails at load with a clear message.
  for (const auto& [name, what] : {std::pair<std::string, std::string>{"qwen3-dense", "4 query heads"},
                                   {"deepseek-v3", "4 attention heads"}}) {
    const std::string cmd = std::string(COROLLA_BINARY) + " logits --device cpu --threads 1 --model tests/data/models/" +
                            name + " --ids 1,2 --out /dev/null --tp 3 2>&1";
    FILE* pipe = popen(cmd.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string output;
    char buf[512];
    while (fgets(buf, sizeof(buf), pipe)) output += buf;
    EXPECT_NE(pclose(pipe), 0);
    EXPECT_NE(output.find(what), std::string::npos) << output;
  }
}

// DP-EP: each rank takes every dp-th sequence (one rank has none with one sequence), experts
// split over all ranks; the gathered logits equal one process's. The hybrid adds Gated DeltaNet
// layers (per-rank states) and a shared expert (local on each rank); DeepSeek-V3 MLA with whole
// heads per rank, a dense first layer and group-limited routing.
class DataParallelCpu : public ::testing::TestWithParam<std::tuple<std::string, int, std::string>> {};

TEST_P(DataParallelCpu, LogitsEqualOneProcess) {
  const auto& [name, dp, ids] = GetParam();
  const std::string model = "tests/data/models/" + name;
  std::vector<float> single = RunLogits(model, ids, "");
  std::vector<float> split = RunLogits(model, ids, "--dp " + std::to_string(dp) + " --ep " + std::to_string(dp));
  ASSERT_FALSE(single.empty());
  ASSERT_EQ(single.size(), split.size());
  double err = 0, scale = 0;
  for (size_t i = 0; i < single.size(); ++i) {
    ASSERT_TRUE(std::isfinite(split[i])) << i;
    err = std::max(err, static_cast<double>(std::fabs(single[i] - split[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(single[i])));
  }
  std::printf("%s --dp %d --ep %d, ids %s: max |diff| %.2e of max|logit| %.2f (rel %.2e)\n", name.c_str(), dp, dp,
              ids.c_str(), err, scale, err / scale);
  EXPECT_LT(err, 1e-5 * scale);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, DataParallelCpu,
    ::testing::Values(
        std::make_tuple("qwen3-moe", 2, "3,141,59,265,358,979,323"),                           // rank 1 empty
        std::make_tuple("qwen3-moe", 2, "3,141,59,265,358;979,323,846,264,338,327,950,288"),  // one each
        std::make_tuple("qwen3-moe", 2, "3,141,59;265,358,979,323;846,264,338,327,950,288,419,716,939,937,1"),
        std::make_tuple("qwen3-moe", 4, "3,141,59;265,358,979,323;846,264,338,327,950,288,419,716,939,937,1"),
        std::make_tuple("qwen3-moe", 4, "3,141,59,265,358,979,323"),                           // 3 ranks empty
        // Eight ranks (issue 9's layouts, here as processes on the CPU): 2 experts each, 5 ranks empty.
        std::make_tuple("qwen3-moe", 8, "3,141,59;265,358,979,323;846,264,338,327,950,288,419,716,939,937,1"),
        std::make_tuple("qwen3.5-moe-hybrid", 4, "3,141,59;265,358,979,323;846,264,338,327,950,288"),
        std::make_tuple("qwen3.5-moe-hybrid", 2, "3,141,59;265,358,979,323;846,264,338,327,950,288"),
        // DeepSeek-V3: MLA whole on each rank (its own latent cache), the dense first layer and the
        // shared expert replicated, routed experts split (16 / 8 in the fp8 fixture, whose experts
        // load per rank from FP8); group-limited sigmoid routing on the token's own rank.
        std::make_tuple("deepseek-v3", 2, "3,141,59,265,358,979,323"),                         // rank 1 empty
        std::make_tuple("deepseek-v3", 2, "3,141,59;265,358,979,323;846,264,338,327,950,288,419,716,939,937,1"),
        std::make_tuple("deepseek-v3", 4, "3,141,59,265,358,979,323"),                         // 3 ranks empty
        std::make_tuple("deepseek-v3", 4, "3,141,59;265,358,979,323;846,264,338,327,950,288,419,716,939,937,1"),
        std::make_tuple("deepseek-v3-fp8", 2, "3,141,59,265,358,979,323"),
        std::make_tuple("deepseek-v3-fp8", 2, "3,141,59;265,358,979,323;846,264,338,327,950,288,419,716,939,937,1"),
        std::make_tuple("deepseek-v3-fp8", 4, "3,141,59,265,358,979,323"),
        std::make_tuple("deepseek-v3-fp8", 4, "3,141,59;265,358,979,323;846,264,338,327,950,288,419,716,939,937,1")));

// DP x TP (issue 6's decode layout): --dp 2 --tp 2 --ep 4, four processes; each replica's
// attention, dense layers and shared expert tensor-parallel over its two ranks, each TP rank
// dispatching half of its replica's tokens (odd counts: 5 = 3 + 2, 1 = 1 + 0) to experts split
// over all four. Also TP-EP through that exchange on two ranks (COROLLA_TP_EP_EXCHANGE=1), the
// path a two-GPU machine can check.
class DataParallelTpCpu : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(DataParallelTpCpu, LogitsEqualOneProcess) {
  const auto& [name, args, ids] = GetParam();
  const std::string model = "tests/data/models/" + name;
  std::vector<float> single = RunLogits(model, ids, "");
  // "--tp 2 --via-exchange": TP-EP with COROLLA_TP_EP_EXCHANGE=1 in the ranks' environment.
  const std::string via = " --via-exchange";
  const bool via_exchange = args.size() > via.size() && args.compare(args.size() - via.size(), via.size(), via) == 0;
  if (via_exchange) setenv("COROLLA_TP_EP_EXCHANGE", "1", 1);
  std::vector<float> split = RunLogits(model, ids, via_exchange ? args.substr(0, args.size() - via.size()) : args);
  unsetenv("COROLLA_TP_EP_EXCHANGE");
  ASSERT_FALSE(single.empty());
  ASSERT_EQ(single.size(), split.size());
  double err = 0, scale = 0;
  for (size_t i = 0; i < single.size(); ++i) {
    ASSERT_TRUE(std::isfinite(split[i])) << i;
    err = std::max(err, static_cast<double>(std::fabs(single[i] - split[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(single[i])));
  }
  std::printf("%s %s, ids %s: max |diff| %.2e of max|logit| %.2f (rel %.2e)\n", name.c_str(), args.c_str(),
              ids.c_str(), err, scale, err / scale);
  EXPECT_LT(err, 1e-5 * scale);
}

constexpr const char* kDpTp = "--dp 2 --tp 2 --ep 4";
INSTANTIATE_TEST_SUITE_P(
    Fixtures, DataParallelTpCpu,
    ::testing::Values(
        std::make_tuple("qwen3-moe", kDpTp, "3,141,59,265,358"),  // replica 1 idle; 5 tokens = 3 + 2
        std::make_tuple("qwen3-moe", kDpTp, "3;141,59,265,358,979"),  // 1 token = 1 + 0; 5 tokens
        std::make_tuple("qwen3-moe", kDpTp, "3,141,59;265,358,979,323;846,264,338,327,950,288,419,716,939,937,1"),
        std::make_tuple("qwen3.5-moe-hybrid", kDpTp, "3,141,59;265,358,979,323;846,264,338,327,950,288"),
        std::make_tuple("qwen3.5-moe-hybrid", kDpTp, "3,141,59,265,358"),
        std::make_tuple("deepseek-v3", kDpTp, "3,141,59,265,358"),
        std::make_tuple("deepseek-v3", kDpTp, "3,141,59;265,358,979,323;846,264,338,327,950,288,419,716,939,937,1"),
        std::make_tuple("deepseek-v3-fp8", kDpTp, "3,141,59;265,358,979,323;846,264,338,327,950,288"),
        std::make_tuple("qwen3-moe", "--tp 2 --via-exchange", "3,141,59,265,358"),
        std::make_tuple("qwen3.5-moe-hybrid", "--tp 2 --via-exchange", "3,141,59;265,358,979,323"),
        std::make_tuple("deepseek-v3", "--tp 2 --via-exchange", "3,141,59,265,358")));

TEST(DataParallelCpu, DpTimesTpGenerateEqualsOneProcess) {
  // Three prompts over two replicas (2 + 1) of two TP ranks, greedy: one process's ids.
  for (const char* name : {"qwen3-moe", "deepseek-v3"}) {
    const std::string args = std::string("generate --device cpu --threads 1 --model tests/data/models/") + name +
                             " --prompt-ids '1,2,3;17,300,42,99,5;7' --max-tokens 8 --temperature 0 --ignore-eos";
    auto [ok1, one] = RunCorolla(args, /*with_stderr=*/false);
    auto [ok2, split] = RunCorolla(args + " --dp 2 --tp 2 --ep 4", /*with_stderr=*/false);
    ASSERT_TRUE(ok1 && ok2) << one << split;
    EXPECT_EQ(std::count(one.begin(), one.end(), '\n'), 3) << one;
    EXPECT_EQ(one, split) << name;
  }
}

TEST(DataParallelCpu, GenerateEqualsOneProcess) {
  // Three prompts over two ranks (2 + 1), greedy: the same ids in the same order.
  const std::string args = "generate --device cpu --threads 1 --model tests/data/models/qwen3-moe --prompt-ids "
                           "'1,2,3;17,300,42,99,5;7' --max-tokens 8 --temperature 0 --ignore-eos";
  auto [ok1, one] = RunCorolla(args, /*with_stderr=*/false);
  auto [ok2, two] = RunCorolla(args + " --dp 2 --ep 2", /*with_stderr=*/false);
  ASSERT_TRUE(ok1 && ok2) << one << two;
  EXPECT_EQ(std::count(one.begin(), one.end(), '\n'), 3) << one;
  EXPECT_EQ(one, two);
}

// DP-EP on DeepSeek-V3: prefill decompressed, decode absorbed, each rank its own prompts (2 + 1
// over two ranks; 1 + 1 + 1 + idle over four), greedy: one process's tokens in its order.
TEST(DataParallelCpu, DeepseekGenerateEqualsOneProcess) {
  for (const char* name : {"deepseek-v3", "deepseek-v3-fp8"}) {
    const std::string args = std::string("generate --device cpu --threads 1 --model tests/data/models/") + name +
                             " --prompt-ids '1,2,3;17,300,42,99,5;7' --max-tokens 12 --temperature 0 --ignore-eos";
    auto [ok1, one] = RunCorolla(args, /*with_stderr=*/false);
    ASSERT_TRUE(ok1) << one;
    EXPECT_EQ(std::count(one.begin(), one.end(), '\n'), 3) << one;
    for (int dp : {2, 4}) {
      const std::string d = std::to_string(dp);
      auto [ok, split] = RunCorolla(args + " --dp " + d + " --ep " + d, /*with_stderr=*/false);
      ASSERT_TRUE(ok) << split;
      EXPECT_EQ(one, split) << name << " --dp " << dp << " --ep " << dp;
    }
  }
}

// Decode steps run MLA in its absorbed form (W_UK / W_UV per local head), prefill in the
// decompressed one: greedy generation with --tp 2 and 4 gives one process's tokens.
TEST(TensorParallelCpu, DeepseekGenerateEqualsOneProcess) {
  for (const char* name : {"deepseek-v3", "deepseek-v3-fp8"}) {
    const std::string args = std::string("generate --device cpu --threads 1 --model tests/data/models/") + name +
                             " --prompt-ids '1,2,3;17,300,42,99,5;7' --max-tokens 12 --temperature 0 --ignore-eos";
    auto [ok1, one] = RunCorolla(args, /*with_stderr=*/false);
    ASSERT_TRUE(ok1) << one;
    EXPECT_EQ(std::count(one.begin(), one.end(), '\n'), 3) << one;
    for (int tp : {2, 4}) {
      auto [ok, split] = RunCorolla(args + " --tp " + std::to_string(tp), /*with_stderr=*/false);
      ASSERT_TRUE(ok) << split;
      EXPECT_EQ(one, split) << name << " --tp " << tp;
    }
  }
}

TEST(DataParallelCpu, UnsplittableShapesAreErrors) {
  // 16 experts do not split over 3 ranks; --ep must be --tp or --dp x --tp.
  const std::string base = "logits --device cpu --threads 1 --model tests/data/models/qwen3-moe --ids 1,2 --out /dev/null ";
  auto [ok3, out3] = RunCorolla(base + "--dp 3 --ep 3");
  EXPECT_FALSE(ok3);
  EXPECT_NE(out3.find("16 experts"), std::string::npos) << out3;
  auto [ok_ep, out_ep] = RunCorolla(base + "--dp 2 --ep 3");
  EXPECT_FALSE(ok_ep);
  EXPECT_NE(out_ep.find("--ep 3"), std::string::npos) << out_ep;
}

}  // namespace
}  // namespace corolla
