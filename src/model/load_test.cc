// Loading checkpoints: config parsing across spellings, and a clear error for every way a
// checkpoint can be broken (missing config, unknown model_type, truncated or out-of-range
// safetensors, a tensor of the wrong shape, a missing or unexpected tensor).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/config.h"
#include "model/deepseek_v3.h"
#include "model/model.h"
#include "model/model_test_util.h"
#include "model/safetensors.h"
#include "parallel/communicator.h"

namespace corolla {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* kMoe = "tests/data/models/qwen3-moe";

json ReadJson(const std::string& path) { return json::parse(ReadFile(path).value()); }

TEST(Config, ParsesTheFixtures) {
  auto c = LoadModelConfig(kMoe);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->family, ModelFamily::kQwen3Moe);
  EXPECT_EQ(c->num_experts, 16);  // num_local_experts in transformers 5 files
  EXPECT_EQ(c->num_experts_per_token, 4);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_DOUBLE_EQ(c->rope.theta, 1e6);  // from rope_parameters
  EXPECT_TRUE(c->is_moe_layer(0));
  auto dense = LoadModelConfig("tests/data/models/qwen3-dense");
  ASSERT_TRUE(dense.ok());
  EXPECT_EQ(dense->family, ModelFamily::kQwen3);
  EXPECT_FALSE(dense->is_moe_layer(0));
}

TEST(Config, AcceptsHubSpellings) {
  // Checkpoints published before transformers 5: rope_theta at top level, num_experts.
  json j = ReadJson(std::string(kMoe) + "/config.json");
  j.erase("rope_parameters");
  j.erase("num_local_experts");
  j["rope_theta"] = 5e5;
  j["rope_scaling"] = nullptr;
  j["num_experts"] = 8;
  j["mlp_only_layers"] = {1};
  j["decoder_sparse_step"] = 1;
  auto c = ParseModelConfig(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->rope.theta, 5e5);
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_TRUE(c->is_moe_layer(0));
  EXPECT_FALSE(c->is_moe_layer(1));
}

TEST(Config, MultimodalWrapperUsesTextConfig) {
  json text = ReadJson(std::string(kMoe) + "/config.json");
  json wrapper = {{"model_type", "qwen3_vl_moe"}, {"text_config", text}};
  auto c = ParseModelConfig(wrapper);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->weight_prefix, "model.language_model.");
  EXPECT_EQ(c->hidden_size, 128);
}

TEST(Config, ErrorsNameTheProblem) {
  json j = ReadJson(std::string(kMoe) + "/config.json");
  j["model_type"] = "llama4";
  auto c = ParseModelConfig(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("model_type 'llama4' is not supported"), std::string::npos);

  j = ReadJson(std::string(kMoe) + "/config.json");
  j["hidden_size"] = "wide";
  c = ParseModelConfig(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("hidden_size"), std::string::npos) << c.status().message();

  j = ReadJson(std::string(kMoe) + "/config.json");
  j.erase("num_attention_heads");
  c = ParseModelConfig(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("num_attention_heads"), std::string::npos);

  j = ReadJson(std::string(kMoe) + "/config.json");
  j["num_key_value_heads"] = 3;
  c = ParseModelConfig(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("multiple"), std::string::npos);
}

TEST(Config, GenerationConfigEos) {
  auto c = LoadModelConfig("models/corolla-demo");
  ASSERT_TRUE(c.ok());
  auto g = LoadGenerationConfig("models/corolla-demo", *c);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->eos_token_ids, (std::vector<int>{2, 0}));
  EXPECT_DOUBLE_EQ(g->temperature.value(), 0.7);
  EXPECT_DOUBLE_EQ(g->top_p.value(), 0.9);
}

// Logits of one fixed prompt, as a flat vector.
std::vector<float> Forward(Model& model, Backend& backend) {
  const TestCaches kv = MakeTestCaches(model, 8);
  Tensor ids = Tensor::Empty(DType::kI32, {5}), pos = Tensor::Empty(DType::kI32, {5});
  Tensor qstart = Tensor::Empty(DType::kI32, {2}), lens = Tensor::Empty(DType::kI32, {1});
  Tensor table = Tensor::Zeros(DType::kI32, {1, 1}), rows = Tensor::Empty(DType::kI32, {5});
  for (int i = 0; i < 5; ++i) {
    ids.ptr<int32_t>()[i] = 100 * i + 7;
    pos.ptr<int32_t>()[i] = rows.ptr<int32_t>()[i] = i;
  }
  qstart.ptr<int32_t>()[0] = 0;
  qstart.ptr<int32_t>()[1] = lens.ptr<int32_t>()[0] = 5;
  ForwardBatch batch{ids, pos, {qstart, lens, table, pos, 5, 5}, rows};
  Tensor logits = Tensor::Empty(DType::kF32, {5, model.config().vocab_size});
  model.Forward(batch, kv.views, logits);
  return std::vector<float>(logits.ptr<float>(), logits.ptr<float>() + logits.numel());
}

// A copy of the qwen3-moe fixture in a temporary directory, to break in one way per test.
class BrokenCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("corolla_load_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
      fs::copy_file(fs::path(kMoe) / f, dir_ / f);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Load() {
    auto backend = MakeCpuBackend();
    auto model = LoadModel(dir_.string(), *backend);
    return model.ok() ? "" : model.status().ToString();
  }

  // Rewrites model.safetensors with `edit` applied to the list of (name, tensor) pairs.
  void Rewrite(const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    {
      auto file = SafetensorsFile::Open((dir_ / "model.safetensors").string());
      ASSERT_TRUE(file.ok());
      for (const auto& e : (*file)->entries()) {
        Tensor t = Tensor::Empty(e.dtype, e.shape);
        std::memcpy(t.view().data, (*file)->View(e).data, e.nbytes);
        tensors.emplace_back(e.name, t);
      }
    }
    edit(tensors);
    std::vector<std::pair<std::string, TensorView>> views;
    for (auto& [n, t] : tensors) views.emplace_back(n, t.view());
    ASSERT_TRUE(WriteSafetensors((dir_ / "model.safetensors").string(), views).ok());
  }

  fs::path dir_;
};

TEST_F(BrokenCheckpoint, IntactCopyLoads) { EXPECT_EQ(Load(), ""); }

TEST_F(BrokenCheckpoint, MissingConfig) {
  fs::remove(dir_ / "config.json");
  EXPECT_NE(Load().find("config.json: cannot open"), std::string::npos) << Load();
}

TEST_F(BrokenCheckpoint, UnknownModelType) {
  json j = ReadJson((dir_ / "config.json").string());
  j["model_type"] = "mamba";
  std::ofstream((dir_ / "config.json").string()) << j.dump();
  EXPECT_NE(Load().find("model_type 'mamba' is not supported"), std::string::npos) << Load();
}

TEST_F(BrokenCheckpoint, TruncatedSafetensors) {
  fs::resize_file(dir_ / "model.safetensors", fs::file_size(dir_ / "model.safetensors") / 2);
  std::string err = Load();
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
  EXPECT_NE(err, "");
}

TEST_F(BrokenCheckpoint, HeaderOffsetsPastTheEnd) {
  // Grow one tensor's end offset in place, keeping the header length.
  std::string bytes = ReadFile((dir_ / "model.safetensors").string()).value();
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  json header = json::parse(bytes.substr(8, n));
  auto& last = header["model.norm.weight"]["data_offsets"];
  int64_t data_size = static_cast<int64_t>(bytes.size() - 8 - n);
  last[1] = data_size + 4096;
  std::string h = header.dump();
  ASSERT_LE(h.size(), n);
  h.resize(n, ' ');
  bytes.replace(8, n, h);
  std::ofstream((dir_ / "model.safetensors").string(), std::ios::binary) << bytes;
  std::string err = Load();
  EXPECT_NE(err.find("model.norm.weight"), std::string::npos) << err;
}

TEST_F(BrokenCheckpoint, WrongShape) {
  Rewrite([](auto& tensors) {
    for (auto& [name, t] : tensors)
      if (name == "model.layers.1.self_attn.k_proj.weight") t = Tensor::Zeros(DType::kBF16, {32, 128});
  });
  std::string err = Load();
  EXPECT_NE(err.find("tensor model.layers.1.self_attn.k_proj.weight: expected [64, 128]"), std::string::npos) << err;
  EXPECT_NE(err.find("got [32, 128] bf16"), std::string::npos) << err;
}

TEST_F(BrokenCheckpoint, MissingTensor) {
  Rewrite([](auto& tensors) {
    std::erase_if(tensors, [](const auto& p) { return p.first == "model.layers.2.mlp.experts.7.up_proj.weight"; });
  });
  std::string err = Load();
  EXPECT_NE(err.find("tensor model.layers.2.mlp.experts.7.up_proj.weight: missing"), std::string::npos) << err;
}

TEST_F(BrokenCheckpoint, UnexpectedTensor) {
  Rewrite([](auto& tensors) { tensors.emplace_back("model.layers.0.mystery.weight", Tensor::Zeros(DType::kBF16, {4})); });
  std::string err = Load();
  EXPECT_NE(err.find("unexpected tensor(s) in the checkpoint: model.layers.0.mystery.weight"), std::string::npos) << err;
}

TEST_F(BrokenCheckpoint, FusedExpertLayoutLoadsTheSame) {
  // transformers 5 saves experts fused: experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I].
  Rewrite([](auto& tensors) {
    for (int l = 0; l < 3; ++l) {
      std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
      Tensor gate_up = Tensor::Empty(DType::kBF16, {16, 128, 128});
      Tensor down = Tensor::Empty(DType::kBF16, {16, 128, 64});
      for (int e = 0; e < 16; ++e) {
        auto find = [&](const std::string& n) {
          for (auto& [name, t] : tensors) if (name == n) return t;
          return Tensor();
        };
        std::string q = p + std::to_string(e) + ".";
        std::memcpy(gate_up.ptr<uint16_t>() + e * 128 * 128, find(q + "gate_proj.weight").view().data, 64 * 128 * 2);
        std::memcpy(gate_up.ptr<uint16_t>() + e * 128 * 128 + 64 * 128, find(q + "up_proj.weight").view().data, 64 * 128 * 2);
        std::memcpy(down.ptr<uint16_t>() + e * 128 * 64, find(q + "down_proj.weight").view().data, 128 * 64 * 2);
      }
      std::erase_if(tensors, [&](const auto& t) { return t.first.rfind(p, 0) == 0; });
      tensors.emplace_back(p + "gate_up_proj", gate_up);
      tensors.emplace_back(p + "down_proj", down);
    }
  });
  ASSERT_EQ(Load(), "");
  // Same weights, same math: the forward must agree bit for bit with the per-expert layout.
  auto backend = MakeCpuBackend();
  auto fused = LoadModel(dir_.string(), *backend).value();
  auto per_expert = LoadModel(kMoe, *backend).value();
  EXPECT_EQ(Forward(*fused, *backend), Forward(*per_expert, *backend));
}

}  // namespace
}  // namespace corolla

namespace corolla {
namespace {

// DeepSeek's multi-token-prediction module (model.layers.<num_hidden_layers>.*), which
// transformers does not save: a copy of the fixture with one added must load it, and name a
// mis-shaped MTP tensor.
class DeepseekMtp : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("corolla_mtp_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const fs::path src = "tests/data/models/deepseek-v3";
    for (const char* f : {"config.json", "generation_config.json"}) fs::copy_file(src / f, dir_ / f);
    auto file = SafetensorsFile::Open((src / "model.safetensors").string()).value();
    for (const auto& e : file->entries()) {
      tensors_.emplace_back(e.name, Tensor::Empty(e.dtype, e.shape));
      std::memcpy(tensors_.back().second.view().data, file->View(e).data, e.nbytes);
      // The MTP layer (index 3) is built like the last decoder layer (a MoE layer).
      const std::string last = "model.layers.2.";
      if (e.name.rfind(last, 0) == 0) {
        Tensor copy = Tensor::Empty(e.dtype, e.shape);
        std::memcpy(copy.view().data, file->View(e).data, e.nbytes);
        tensors_.emplace_back("model.layers.3." + e.name.substr(last.size()), copy);
      }
    }
    const int64_t h = 128;
    for (const char* n : {"enorm.weight", "hnorm.weight", "shared_head.norm.weight"})
      tensors_.emplace_back(std::string("model.layers.3.") + n, Tensor::Zeros(DType::kBF16, {h}));
    tensors_.emplace_back("model.layers.3.eh_proj.weight", Tensor::Zeros(DType::kBF16, {h, 2 * h}));
    tensors_.emplace_back("model.layers.3.embed_tokens.weight", Tensor::Zeros(DType::kBF16, {1024, h}));
    tensors_.emplace_back("model.layers.3.shared_head.head.weight", Tensor::Zeros(DType::kBF16, {1024, h}));
  }
  void TearDown() override { fs::remove_all(dir_); }
  Result<std::unique_ptr<Model>> Load(const ModelShard& shard = {}) {
    std::vector<std::pair<std::string, TensorView>> views;
    for (auto& [n, t] : tensors_) views.emplace_back(n, t.view());
    Status s = WriteSafetensors((dir_ / "model.safetensors").string(), views);
    if (!s.ok()) return s;
    return LoadModel(dir_.string(), *backend_, shard);
  }

  fs::path dir_;
  std::unique_ptr<Backend> backend_ = MakeCpuBackend();
  std::vector<std::pair<std::string, Tensor>> tensors_;
};

TEST_F(DeepseekMtp, LoadsTheModule) {
  auto model = Load();
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ(NumMtpModules(**model), 1);
  auto plain = LoadModel("tests/data/models/deepseek-v3", *backend_).value();
  EXPECT_EQ(NumMtpModules(*plain), 0);
}

// Loading needs a communicator per group; no forward runs, so it is never called.
class UnusedCommunicator final : public Communicator {
 public:
  explicit UnusedCommunicator(int rank) : rank_(rank) {}
  int size() const override { return 2; }
  int rank() const override { return rank_; }
  std::string name() const override { return "unused"; }
  void AllReduceSum(const TensorView&) override { ADD_FAILURE() << "all-reduce at load"; }
  void AllToAllV(const TensorView&, std::span<const int64_t>, const TensorView&, std::span<const int64_t>) override {
    ADD_FAILURE() << "all-to-all at load";
  }

 private:
  int rank_;
};

TEST_F(DeepseekMtp, LoadsTheModuleOnEachTensorParallelRank) {
  // The MTP layer is split like the decoder layers: each rank takes its heads and experts, and
  // every tensor counts as used (the other rank's parts included).
  for (int rank = 0; rank < 2; ++rank) {
    UnusedCommunicator comm(rank);
    ModelShard shard{.tp_size = 2, .tp_rank = rank, .tp = &comm, .ep_size = 2, .ep_rank = rank, .ep = &comm};
    auto model = Load(shard);
    ASSERT_TRUE(model.ok()) << "rank " << rank << ": " << model.status().ToString();
    EXPECT_EQ(NumMtpModules(**model), 1);
  }
}

TEST_F(DeepseekMtp, NamesAMisshapenTensor) {
  for (auto& [n, t] : tensors_)
    if (n == "model.layers.3.eh_proj.weight") t = Tensor::Zeros(DType::kBF16, {128, 128});
  auto model = Load();
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("tensor model.layers.3.eh_proj.weight: expected [128, 256]"),
            std::string::npos)
      << model.status().ToString();
}

}  // namespace
}  // namespace corolla
