// The parallel layer on the CPU: rank layout and environment, the TCP bootstrap, the weight
// shards, and tensor + expert parallelism end to end through the launcher (`corolla logits
// --tp N --device cpu` against one process, on the qwen3-dense and qwen3-moe fixtures; TP 4
// replicates their 2 KV heads). The NCCL path runs on GPUs (scripts/gpu_run_multi.sh).
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "model/safetensors.h"
#include "parallel/rank_layout.h"
#include "parallel/tcp_store.h"

namespace corolla {
namespace {

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

// Logits [L, V] of `ids` from `corolla logits` with `extra` arguments.
std::vector<float> RunLogits(const std::string& model, const std::string& ids, const std::string& extra) {
  const std::string out = ::testing::TempDir() + "parallel_logits_" + std::to_string(getpid()) + ".safetensors";
  const std::string cmd = std::string(COROLLA_BINARY) + " logits --device cpu --threads 1 --model " + model +
                          " --ids " + ids + " --out " + out + " " + extra;
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
  std::printf("%s --tp %d on the CPU: max |diff| %.2e of max|logit| %.2f\n", name.c_str(), tp, err, scale);
  EXPECT_LT(err, 1e-4 * scale);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelCpu,
                         ::testing::Values(std::make_tuple("qwen3-dense", 2), std::make_tuple("qwen3-moe", 2),
                                           std::make_tuple("qwen3-dense", 4), std::make_tuple("qwen3-moe", 4)));

TEST(TensorParallelCpu, UnsplittableShapesAreErrors) {
  // 4 query heads do not split over 3 ranks: every rank fails at load with a clear message.
  const std::string cmd = std::string(COROLLA_BINARY) +
                          " logits --device cpu --threads 1 --model tests/data/models/qwen3-dense --ids 1,2"
                          " --out /dev/null --tp 3 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe)) output += buf;
  EXPECT_NE(pclose(pipe), 0);
  EXPECT_NE(output.find("4 query heads"), std::string::npos) << output;
}

}  // namespace
}  // namespace corolla
