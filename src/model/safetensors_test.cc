#include "model/safetensors.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace corolla {
namespace {

namespace fs = std::filesystem;

constexpr const char* kMoeModel = "tests/data/models/qwen3-moe/model.safetensors";
constexpr const char* kMoeDir = "tests/data/models/qwen3-moe";
constexpr const char* kMoeGolden = "tests/data/golden/qwen3-moe.safetensors";

// A fresh directory under the test temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "corolla_st_XXXXXX").string();
    COROLLA_CHECK(mkdtemp(pattern.data()) != nullptr) << "mkdtemp " << pattern;
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  COROLLA_CHECK(out.good()) << "writing " << path;
}

std::string LengthPrefix(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

// A file image: length prefix, `header` verbatim, then `data_size` bytes of data.
std::string FileBytes(const std::string& header, size_t data_size) {
  return LengthPrefix(header.size()) + header + std::string(data_size, '\x5a');
}

Result<std::vector<SafetensorsEntry>> Parse(
    const std::string& bytes, std::map<std::string, std::string>* metadata = nullptr) {
  return SafetensorsFile::ParseHeader(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                      metadata);
}

std::string Message(const Status& s) { return s.message(); }

// Owns random bytes shaped as a tensor.
struct HostTensor {
  std::vector<uint8_t> bytes;
  TensorView view;
  HostTensor(DType dtype, Shape shape, std::mt19937& rng) {
    bytes.resize(static_cast<size_t>(shape.numel() * DTypeSize(dtype)));
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    view = TensorView(bytes.empty() ? nullptr : bytes.data(), dtype, shape);
  }
};

// ---------------------------------------------------------------------------------------------
// Writer and round trip

TEST(SafetensorsTest, RoundTripEveryDTypeAndShape) {
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3,
                          DType::kI32, DType::kI64,  DType::kU8};
  const Shape shapes[] = {Shape{},     Shape{0},       Shape{3},
                          Shape{2, 3}, Shape{2, 0, 4}, Shape{1, 2, 3, 5}};
  std::mt19937 rng(7);
  std::vector<std::unique_ptr<HostTensor>> owned;
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (DType dtype : dtypes) {
    for (const Shape& shape : shapes) {
      std::string name = std::string("t.") + DTypeName(dtype) + "." + shape.ToString();
      owned.push_back(std::make_unique<HostTensor>(dtype, shape, rng));
      tensors.emplace_back(name, owned.back()->view);
    }
  }
  TempDir dir;
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "round trip"}};
  ASSERT_TRUE(WriteSafetensors(dir / "rt.safetensors", tensors, metadata).ok());

  auto file = SafetensorsFile::Open(dir / "rt.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->metadata(), metadata);
  ASSERT_EQ((*file)->entries().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, expected] = tensors[i];
    SCOPED_TRACE(name);
    const SafetensorsEntry* e = (*file)->Find(name);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->dtype, expected.dtype);
    EXPECT_EQ(e->shape, expected.shape);
    EXPECT_EQ(e->nbytes, expected.nbytes());
    TensorView v = (*file)->View(*e);
    EXPECT_EQ(v.dtype, expected.dtype);
    EXPECT_EQ(v.shape, expected.shape);
    EXPECT_TRUE(v.is_contiguous());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % DTypeSize(v.dtype), 0u) << "misaligned";
    if (expected.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(v.data, expected.data, expected.nbytes()), 0);
    }
  }
  EXPECT_EQ((*file)->Find("nope"), nullptr);
}

TEST(SafetensorsTest, WriterPadsHeaderWithSpacesAndOrdersByElementSize) {
  std::mt19937 rng(1);
  HostTensor a(DType::kU8, Shape{3}, rng);
  HostTensor b(DType::kF32, Shape{1}, rng);
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir / "x.safetensors", {{"a", a.view}, {"b", b.view}}).ok());
  std::string bytes = ReadBytes(dir / "x.safetensors");
  const std::string json = R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("a":{"dtype":"U8","shape":[3],"data_offsets":[4,7]}})";
  std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  ASSERT_EQ(padded.size() % 8, 0u);
  EXPECT_EQ(bytes.substr(0, 8), LengthPrefix(padded.size()));
  EXPECT_EQ(bytes.substr(8, padded.size()), padded);
  EXPECT_EQ(bytes.size(), 8 + padded.size() + 7);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + padded.size(), b.bytes.data(), 4), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + padded.size() + 4, a.bytes.data(), 3), 0);
  EXPECT_FALSE(fs::exists(dir / "x.safetensors.tmp"));
}

TEST(SafetensorsTest, WriterAcceptsNoTensors) {
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir / "e.safetensors", {}).ok());
  EXPECT_EQ(ReadBytes(dir / "e.safetensors"), LengthPrefix(8) + "{}      ");
  auto file = SafetensorsFile::Open(dir / "e.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE((*file)->entries().empty());
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  std::mt19937 rng(2);
  HostTensor t(DType::kF32, Shape{4, 4}, rng);
  TempDir dir;
  TensorView strided = t.view;
  strided.shape = Shape{4, 2};  // every other column: not contiguous
  Status s = WriteSafetensors(dir / "w.safetensors", {{"s", strided}});
  EXPECT_NE(Message(s).find("not contiguous"), std::string::npos) << s.ToString();
  s = WriteSafetensors(dir / "w.safetensors", {{"x", t.view}, {"x", t.view.Reshape(Shape{16})}});
  EXPECT_NE(Message(s).find("x given twice"), std::string::npos) << s.ToString();
  s = WriteSafetensors(dir / "w.safetensors", {{"__metadata__", t.view}});
  EXPECT_NE(Message(s).find("reserved"), std::string::npos) << s.ToString();
  TensorView device = t.view;
  device.device = Device::kCuda;
  s = WriteSafetensors(dir / "w.safetensors", {{"d", device}});
  EXPECT_NE(Message(s).find("not in host memory"), std::string::npos) << s.ToString();
  EXPECT_FALSE(fs::exists(dir / "w.safetensors"));
}

// ---------------------------------------------------------------------------------------------
// Real fixtures

TEST(SafetensorsTest, ReadsQwen3MoeModel) {
  auto file = SafetensorsFile::Open(kMoeModel);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const SafetensorsFile& f = **file;
  EXPECT_EQ(f.path(), kMoeModel);
  EXPECT_EQ(f.entries().size(), 174u);
  EXPECT_EQ(f.metadata().at("format"), "pt");

  struct Expected {
    const char* name;
    Shape shape;
    int64_t offset;
  };
  const Expected expected[] = {
      {"lm_head.weight", Shape{1024, 128}, 0},
      {"model.embed_tokens.weight", Shape{1024, 128}, 262144},
      {"model.layers.0.input_layernorm.weight", Shape{128}, 524288},
      {"model.layers.0.mlp.experts.0.down_proj.weight", Shape{128, 64}, 524544},
      {"model.layers.0.mlp.experts.0.gate_proj.weight", Shape{64, 128}, 540928},
      {"model.norm.weight", Shape{128}, 3192704},
  };
  const std::string raw = ReadBytes(kMoeModel);
  const size_t data_start = 8 + 19624;
  for (const Expected& x : expected) {
    SCOPED_TRACE(x.name);
    const SafetensorsEntry* e = f.Find(x.name);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->dtype, DType::kBF16);
    EXPECT_EQ(e->shape, x.shape);
    EXPECT_EQ(e->offset, x.offset);
    TensorView v = f.View(*e);
    EXPECT_EQ(v.ToString(), x.shape.ToString() + " bf16");
    // The view reads the same bytes as a plain read of the file.
    ASSERT_EQ(std::memcmp(v.data, raw.data() + data_start + x.offset, e->nbytes), 0);
  }
  // Entries come in data order.
  for (size_t i = 1; i < f.entries().size(); ++i) {
    EXPECT_EQ(f.entries()[i].offset, f.entries()[i - 1].offset + f.entries()[i - 1].nbytes);
  }
}

TEST(SafetensorsTest, ReadsGoldenLogits) {
  auto file = SafetensorsFile::Open(kMoeGolden);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const SafetensorsFile& f = **file;
  EXPECT_EQ(f.entries().size(), 13u);
  EXPECT_EQ(f.metadata().at("seed"), "1331");
  EXPECT_EQ(f.metadata().at("model_type"), "qwen3_moe");

  const SafetensorsEntry* ids = f.Find("ids_4");
  ASSERT_NE(ids, nullptr);
  EXPECT_EQ(ids->dtype, DType::kI32);
  EXPECT_EQ(ids->shape, Shape{130});
  TensorView ids_view = f.View(*ids);
  for (int64_t i = 0; i < ids_view.numel(); ++i) {
    EXPECT_GE(ids_view.ptr<int32_t>()[i], 0);
    EXPECT_LT(ids_view.ptr<int32_t>()[i], 1024);
  }
  const SafetensorsEntry* ids0 = f.Find("ids_0");
  ASSERT_NE(ids0, nullptr);
  EXPECT_EQ(ids0->shape, Shape{1});

  const SafetensorsEntry* logits = f.Find("logits_4");
  ASSERT_NE(logits, nullptr);
  EXPECT_EQ(logits->dtype, DType::kF32);
  EXPECT_EQ(logits->shape, (Shape{130, 1024}));
  TensorView lv = f.View(*logits);
  for (int64_t i = 0; i < lv.numel(); ++i) ASSERT_TRUE(std::isfinite(lv.ptr<float>()[i])) << i;
}

TEST(SafetensorsTest, TruncatedRealFileIsAnErrorNotACrash) {
  const std::string raw = ReadBytes(kMoeModel);
  ASSERT_GT(raw.size(), 20000u);
  TempDir dir;
  const size_t header_end = 8 + 19624;
  for (size_t len : {size_t{0}, size_t{4}, size_t{8}, size_t{100}, header_end - 1, header_end,
                     header_end + 10, raw.size() / 2, raw.size() - 1}) {
    SCOPED_TRACE(len);
    const std::string path = dir / "cut.safetensors";
    WriteBytes(path, raw.substr(0, len));
    auto file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(Message(file.status()).rfind(path + ": ", 0), 0u) << file.status().ToString();
  }
}

// ---------------------------------------------------------------------------------------------
// Validation, one malformed header at a time

struct BadCase {
  const char* what;
  std::string bytes;
  StatusCode code;
  std::string expected;  // must occur in the message
};

std::string OneTensor(const std::string& body) { return R"({"w":)" + body + "}"; }

std::vector<BadCase> BadCases() {
  const std::string f32x2 = R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  return {
      {"short file", "abc", StatusCode::kCorrupt, "3 bytes, shorter than the 8-byte header length"},
      {"length past end", LengthPrefix(100) + "{}", StatusCode::kCorrupt,
       "header length 100 extends past the end of the file (10 bytes)"},
      {"absurd length", LengthPrefix(200'000'000) + "{}", StatusCode::kCorrupt, "absurd"},
      {"huge length", LengthPrefix(~uint64_t{0}) + "{}", StatusCode::kCorrupt, "absurd"},
      {"not json", FileBytes("{not json", 0), StatusCode::kCorrupt, "header is not valid JSON"},
      {"empty header", FileBytes("", 0), StatusCode::kCorrupt, "header is not valid JSON"},
      {"trailing garbage", FileBytes("{} x", 0), StatusCode::kCorrupt, "not valid JSON"},
      {"not object", FileBytes("[1, 2]", 0), StatusCode::kCorrupt, "header is not a JSON object"},
      {"entry not object", FileBytes(OneTensor("3"), 0), StatusCode::kCorrupt,
       "tensor w: entry is not an object"},
      {"no dtype", FileBytes(OneTensor(R"({"shape":[2],"data_offsets":[0,8]})"), 8),
       StatusCode::kCorrupt, "tensor w: missing \"dtype\""},
      {"no shape", FileBytes(OneTensor(R"({"dtype":"F32","data_offsets":[0,8]})"), 8),
       StatusCode::kCorrupt, "tensor w: missing \"shape\""},
      {"no offsets", FileBytes(OneTensor(R"({"dtype":"F32","shape":[2]})"), 8),
       StatusCode::kCorrupt, "tensor w: missing \"data_offsets\""},
      {"unknown dtype",
       FileBytes(OneTensor(R"({"dtype":"F64","shape":[1],"data_offsets":[0,8]})"), 8),
       StatusCode::kUnsupported, "tensor w: dtype F64 is not supported"},
      {"dtype not string",
       FileBytes(OneTensor(R"({"dtype":4,"shape":[1],"data_offsets":[0,4]})"), 4),
       StatusCode::kCorrupt, "dtype is not a string"},
      {"shape not list",
       FileBytes(OneTensor(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})"), 8),
       StatusCode::kCorrupt, "shape is not a list of non-negative integers"},
      {"negative dim",
       FileBytes(OneTensor(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"), 8),
       StatusCode::kCorrupt, "shape is not a list of non-negative integers: [-2]"},
      {"float dim",
       FileBytes(OneTensor(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})"), 8),
       StatusCode::kCorrupt, "shape is not a list of non-negative integers"},
      {"rank 5",
       FileBytes(OneTensor(R"({"dtype":"U8","shape":[1,1,1,1,2],"data_offsets":[0,2]})"), 2),
       StatusCode::kUnsupported, "tensor w: rank 5 exceeds kMaxDims (4)"},
      {"one offset", FileBytes(OneTensor(R"({"dtype":"F32","shape":[2],"data_offsets":[8]})"), 8),
       StatusCode::kCorrupt, "data_offsets is not two non-negative integers"},
      {"three offsets",
       FileBytes(OneTensor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8,8]})"), 8),
       StatusCode::kCorrupt, "data_offsets is not two non-negative integers"},
      {"string offset",
       FileBytes(OneTensor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,"8"]})"), 8),
       StatusCode::kCorrupt, "data_offsets is not two non-negative integers"},
      {"negative offset",
       FileBytes(OneTensor(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})"), 8),
       StatusCode::kCorrupt, "data_offsets is not two non-negative integers"},
      {"begin after end",
       FileBytes(OneTensor(R"({"dtype":"F32","shape":[1],"data_offsets":[8,4]})"), 8),
       StatusCode::kCorrupt, "tensor w: data_offsets [8, 4) begin after they end"},
      {"past data",
       FileBytes(R"({"model.layers.0.mlp.gate.weight":{"dtype":"F32","shape":[50],)"
                 R"("data_offsets":[100,300]}})",
                 200),
       StatusCode::kCorrupt,
       "tensor model.layers.0.mlp.gate.weight: data_offsets [100, 300) extend past the data "
       "section (200 bytes)"},
      {"offset past data far",
       FileBytes(OneTensor(R"({"dtype":"U8","shape":[1],)"
                           R"("data_offsets":[18446744073709551614,18446744073709551615]})"),
                 8),
       StatusCode::kCorrupt, "extend past the data section (8 bytes)"},
      {"size mismatch",
       FileBytes(OneTensor(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"), 8),
       StatusCode::kCorrupt, "data_offsets [0, 8) hold 8 bytes but [3] F32 needs 12"},
      {"numel overflow",
       FileBytes(
           OneTensor(R"({"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]})"), 8),
       StatusCode::kCorrupt, "too large (byte size overflows)"},
      {"bytes overflow",
       FileBytes(OneTensor(R"({"dtype":"I64","shape":[4611686018427387904],"data_offsets":[0,8]})"),
                 8),
       StatusCode::kCorrupt, "too large (byte size overflows)"},
      {"dim beyond int64",
       FileBytes(OneTensor(R"({"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,8]})"),
                 8),
       StatusCode::kCorrupt, "too large (byte size overflows)"},
      {"overlap",
       FileBytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 12),
       StatusCode::kCorrupt, "tensor b at [4, 12) overlaps tensor a at [0, 8)"},
      {"same offsets",
       FileBytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                 8),
       StatusCode::kCorrupt, "overlaps"},
      {"hole",
       FileBytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                 R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                 12),
       StatusCode::kCorrupt, "hole in the data section: bytes [4, 8) before tensor b"},
      {"leading hole",
       FileBytes(OneTensor(R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})"), 8),
       StatusCode::kCorrupt, "hole in the data section: bytes [0, 4) before tensor w"},
      {"trailing bytes", FileBytes(OneTensor(f32x2), 12), StatusCode::kCorrupt,
       "data section has 12 bytes but its tensors cover only 8"},
      {"metadata not map", FileBytes(R"({"__metadata__":[1]})", 0), StatusCode::kCorrupt,
       "__metadata__ is not a map of strings to strings"},
      {"metadata value not string", FileBytes(R"({"__metadata__":{"k":1}})", 0),
       StatusCode::kCorrupt, "__metadata__ is not a map of strings to strings: value of k is 1"},
      {"invalid utf8", FileBytes("{\"\xff\":1}", 0), StatusCode::kCorrupt, "not valid JSON"},
  };
}

TEST(SafetensorsTest, EveryMalformedHeaderIsRejectedWithItsReason) {
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(c.what);
    auto r = Parse(c.bytes);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.expected), std::string::npos)
        << "message: " << r.status().message() << "\nexpected to contain: " << c.expected;
  }
}

TEST(SafetensorsTest, OpenErrorsNameTheFile) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  WriteBytes(path, FileBytes(R"({"model.layers.0.mlp.gate.weight":{"dtype":"F32","shape":[50],)"
                             R"("data_offsets":[100,300]}})",
                             200));
  auto r = SafetensorsFile::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            path +
                ": tensor model.layers.0.mlp.gate.weight: data_offsets [100, 300) extend past "
                "the data section (200 bytes)");

  auto missing = SafetensorsFile::Open(dir / "absent.safetensors");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("absent.safetensors"), std::string::npos);

  auto directory = SafetensorsFile::Open(dir.path());
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.status().message().find("not a regular file"), std::string::npos);
}

TEST(SafetensorsTest, AcceptsEdgeCasesTheFormatAllows) {
  // No tensors, no data.
  auto empty = Parse(FileBytes("{}", 0));
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty->empty());
  // Zero-size tensors anywhere (even between others), a scalar, extra keys, whitespace.
  std::map<std::string, std::string> metadata;
  auto r = Parse(FileBytes(R"( {"__metadata__":{"a":"b"},)"
                           R"("s":{"dtype":"F32","shape":[],"data_offsets":[0,4],"extra":1},)"
                           R"("z":{"dtype":"BF16","shape":[0,7],"data_offsets":[4,4]},)"
                           R"("u":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}   )",
                           6),
                 &metadata);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0].name, "s");
  EXPECT_EQ((*r)[0].shape.rank, 0);
  EXPECT_EQ((*r)[1].name, "z");
  EXPECT_EQ((*r)[1].nbytes, 0);
  EXPECT_EQ((*r)[2].name, "u");
  EXPECT_EQ(metadata.at("a"), "b");
}

// ---------------------------------------------------------------------------------------------
// Checkpoint directories

TEST(CheckpointTest, OpensSingleFileModel) {
  auto ckpt = Checkpoint::Open(kMoeDir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  std::vector<std::string> names = (*ckpt)->Names();
  EXPECT_EQ(names.size(), 174u);
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_TRUE((*ckpt)->Has("model.embed_tokens.weight"));
  auto embed = (*ckpt)->Get("model.embed_tokens.weight");
  ASSERT_TRUE(embed.ok());
  EXPECT_EQ(embed->ToString(), "[1024, 128] bf16");
  auto missing = (*ckpt)->Get("model.layers.99.mlp.gate.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("model.layers.99.mlp.gate.weight"), std::string::npos);
}

// Writes two shards and an index over them; returns the tensors' bytes by name.
std::map<std::string, std::vector<uint8_t>> WriteShardedModel(const TempDir& dir,
                                                              bool with_index = true) {
  std::mt19937 rng(3);
  std::map<std::string, std::vector<uint8_t>> bytes;
  HostTensor a(DType::kBF16, Shape{4, 8}, rng), b(DType::kF32, Shape{8}, rng);
  HostTensor c(DType::kI64, Shape{2, 2}, rng), d(DType::kF8E4M3, Shape{3, 5}, rng);
  COROLLA_CHECK(WriteSafetensors(dir / "model-00001-of-00002.safetensors",
                                 {{"layers.0.a", a.view}, {"layers.0.b", b.view}})
                    .ok())
      << "shard 1";
  COROLLA_CHECK(WriteSafetensors(dir / "model-00002-of-00002.safetensors",
                                 {{"layers.1.c", c.view}, {"layers.1.d", d.view}})
                    .ok())
      << "shard 2";
  if (with_index) {
    WriteBytes(dir / "model.safetensors.index.json", R"({
      "metadata": {"total_size": 152},
      "weight_map": {
        "layers.0.a": "model-00001-of-00002.safetensors",
        "layers.0.b": "model-00001-of-00002.safetensors",
        "layers.1.c": "model-00002-of-00002.safetensors",
        "layers.1.d": "model-00002-of-00002.safetensors"
      }})");
  }
  bytes["layers.0.a"] = a.bytes;
  bytes["layers.0.b"] = b.bytes;
  bytes["layers.1.c"] = c.bytes;
  bytes["layers.1.d"] = d.bytes;
  return bytes;
}

void ExpectShardedModel(const Checkpoint& ckpt,
                        const std::map<std::string, std::vector<uint8_t>>& bytes) {
  EXPECT_EQ(ckpt.Names(),
            (std::vector<std::string>{"layers.0.a", "layers.0.b", "layers.1.c", "layers.1.d"}));
  for (const auto& [name, expected] : bytes) {
    SCOPED_TRACE(name);
    auto v = ckpt.Get(name);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    ASSERT_EQ(v->nbytes(), static_cast<int64_t>(expected.size()));
    EXPECT_EQ(std::memcmp(v->data, expected.data(), expected.size()), 0);
  }
  ASSERT_NE(ckpt.Find("layers.1.d"), nullptr);
  EXPECT_EQ(ckpt.Find("layers.1.d")->dtype, DType::kF8E4M3);
  EXPECT_EQ(ckpt.Find("layers.1.c")->shape, (Shape{2, 2}));
  EXPECT_FALSE(ckpt.Has("layers.2.a"));
}

TEST(CheckpointTest, OpensShardsListedByIndex) {
  TempDir dir;
  auto bytes = WriteShardedModel(dir);
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  ExpectShardedModel(**ckpt, bytes);
}

TEST(CheckpointTest, OpensEverySafetensorsFileWithoutIndex) {
  TempDir dir;
  auto bytes = WriteShardedModel(dir, /*with_index=*/false);
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  ExpectShardedModel(**ckpt, bytes);
}

TEST(CheckpointTest, DuplicateTensorAcrossFilesWithoutIndexIsAnError) {
  TempDir dir;
  WriteShardedModel(dir, /*with_index=*/false);
  std::mt19937 rng(4);
  HostTensor a(DType::kBF16, Shape{4, 8}, rng);
  ASSERT_TRUE(WriteSafetensors(dir / "extra.safetensors", {{"layers.0.a", a.view}}).ok());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.status().message().find("tensor layers.0.a is in both"), std::string::npos)
      << ckpt.status().ToString();
}

TEST(CheckpointTest, IndexErrors) {
  struct Case {
    const char* what;
    std::string index;  // empty: write no index, remove shard 2 instead
    std::string expected;
    StatusCode code;
  };
  const Case cases[] = {
      {"malformed json", R"({"weight_map": {)", "not valid JSON", StatusCode::kCorrupt},
      {"no weight_map", R"({"metadata": {}})", "no weight_map", StatusCode::kCorrupt},
      {"weight_map not object", R"({"weight_map": []})", "weight_map is not a map",
       StatusCode::kCorrupt},
      {"shard not string", R"({"weight_map": {"layers.0.a": 1}})", "not a file name",
       StatusCode::kCorrupt},
      {"shard outside dir", R"({"weight_map": {"layers.0.a": "../model.safetensors"}})",
       "not a file name in the directory", StatusCode::kCorrupt},
      {"missing shard", R"({"weight_map": {"layers.0.a": "model-00003-of-00003.safetensors"}})",
       "shard model-00003-of-00003.safetensors (holding layers.0.a) is missing",
       StatusCode::kNotFound},
      {"tensor in wrong shard",
       R"({"weight_map": {"layers.0.a": "model-00002-of-00002.safetensors"}})",
       "weight_map puts tensor layers.0.a in model-00002-of-00002.safetensors, which does not "
       "contain it",
       StatusCode::kCorrupt},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TempDir dir;
    WriteShardedModel(dir, /*with_index=*/false);
    WriteBytes(dir / "model.safetensors.index.json", c.index);
    auto ckpt = Checkpoint::Open(dir.path());
    ASSERT_FALSE(ckpt.ok());
    EXPECT_EQ(ckpt.status().code(), c.code) << ckpt.status().ToString();
    EXPECT_NE(ckpt.status().message().find(c.expected), std::string::npos)
        << ckpt.status().ToString();
  }
}

TEST(CheckpointTest, CorruptShardNamesTheShard) {
  TempDir dir;
  WriteShardedModel(dir);
  std::string raw = ReadBytes(dir / "model-00002-of-00002.safetensors");
  WriteBytes(dir / "model-00002-of-00002.safetensors", raw.substr(0, raw.size() - 3));
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.status().message().find("model-00002-of-00002.safetensors: "), std::string::npos)
      << ckpt.status().ToString();
}

TEST(CheckpointTest, EmptyOrMissingDirectory) {
  TempDir dir;
  auto empty = Checkpoint::Open(dir.path());
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kNotFound);
  EXPECT_NE(empty.status().message().find("no model.safetensors"), std::string::npos);
  auto missing = Checkpoint::Open(dir / "nowhere");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------------------------
// Fuzzing: mutate valid files and check that ParseHeader never crashes and never accepts an
// entry outside the buffer. Seeded, so a failure repeats; bounded by iterations and time.

class HeaderMutator {
 public:
  explicit HeaderMutator(uint64_t seed) : rng_(seed) {}

  // `header` is the JSON text, `data` the data section; returns a whole file image.
  std::string Mutate(std::string header, const std::string& data) {
    const int num_mutations = 1 + Below(4);
    bool keep_prefix_in_sync = Below(4) != 0;
    const uint64_t original_len = header.size();
    for (int m = 0; m < num_mutations; ++m) MutateHeader(header);
    uint64_t prefix = keep_prefix_in_sync ? header.size() : original_len;
    if (Below(10) == 0) prefix = Below(3) == 0 ? rng_() : prefix + Below(17) - 8;
    std::string file = LengthPrefix(prefix) + header + data;
    switch (Below(8)) {
      case 0:
        file.resize(Below(file.size() + 1));
        break;  // truncate anywhere
      case 1:
        file[Below(file.size())] ^= static_cast<char>(1 << Below(8));
        break;  // bit flip
      case 2:
        file.append(Below(16), static_cast<char>(rng_()));
        break;  // trailing bytes
      default:
        break;
    }
    return file;
  }

 private:
  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

  static bool IsToken(char c) { return std::strchr("{}[],:\"", c) != nullptr && c != '\0'; }

  void MutateHeader(std::string& h) {
    if (h.empty()) {
      h = "{}";
      return;
    }
    static const char* const kInteresting[] = {"-1",
                                               "0",
                                               "1e3",
                                               "2.5",
                                               "18446744073709551615",
                                               "9223372036854775807",
                                               "4611686018427387904",
                                               "null",
                                               "true",
                                               "\"F64\"",
                                               "\"BF16\"",
                                               "[]",
                                               "{}",
                                               "\"\"",
                                               "[0,0]",
                                               "[1,1,1,1,1]",
                                               "\"__metadata__\"",
                                               "\xff",
                                               "\\u0000",
                                               "[[[[[[[[",
                                               "}}}}"};
    switch (Below(8)) {
      case 0: {  // bit flip inside the header
        h[Below(h.size())] ^= static_cast<char>(1 << Below(8));
        break;
      }
      case 1: {  // change, insert or delete a digit of some number
        std::vector<size_t> digits;
        for (size_t i = 0; i < h.size(); ++i)
          if (std::isdigit(static_cast<unsigned char>(h[i]))) digits.push_back(i);
        if (digits.empty()) break;
        size_t at = digits[Below(digits.size())];
        switch (Below(3)) {
          case 0:
            h[at] = static_cast<char>('0' + Below(10));
            break;
          case 1:
            h.insert(at, 1, static_cast<char>('0' + Below(10)));
            break;
          case 2:
            h.erase(at, 1);
            break;
        }
        break;
      }
      case 2: {  // swap two JSON structural tokens
        std::vector<size_t> tokens;
        for (size_t i = 0; i < h.size(); ++i)
          if (IsToken(h[i])) tokens.push_back(i);
        if (tokens.size() < 2) break;
        std::swap(h[tokens[Below(tokens.size())]], h[tokens[Below(tokens.size())]]);
        break;
      }
      case 3: {  // replace one structural token with another
        std::vector<size_t> tokens;
        for (size_t i = 0; i < h.size(); ++i)
          if (IsToken(h[i])) tokens.push_back(i);
        if (tokens.empty()) break;
        h[tokens[Below(tokens.size())]] = "{}[],:\" "[Below(8)];
        break;
      }
      case 4: {  // splice in an interesting value over a short range
        size_t at = Below(h.size());
        h.replace(at, Below(6), kInteresting[Below(std::size(kInteresting))]);
        break;
      }
      case 5: {  // delete a range
        size_t at = Below(h.size());
        h.erase(at, 1 + Below(24));
        break;
      }
      case 6: {  // duplicate a range elsewhere (repeats keys, entries, digits)
        size_t at = Below(h.size());
        std::string piece = h.substr(at, 1 + Below(48));
        h.insert(Below(h.size() + 1), piece);
        break;
      }
      case 7: {  // change a dtype name
        static const char* const kDTypes[] = {"F32", "BF16", "F16", "F8_E4M3", "I32",
                                              "I64", "U8",   "F64", "BOOL",    ""};
        size_t at = h.find("\"dtype\":\"", Below(h.size()));
        if (at == std::string::npos) at = h.find("\"dtype\":\"");
        if (at == std::string::npos) break;
        at += 9;
        size_t end = h.find('"', at);
        if (end == std::string::npos) break;
        h.replace(at, end - at, kDTypes[Below(std::size(kDTypes))]);
        break;
      }
    }
  }

  std::mt19937_64 rng_;
};

// Checks what ParseHeader promises for an accepted buffer.
void ExpectAcceptedEntriesInside(const std::string& file, const std::vector<SafetensorsEntry>& es,
                                 uint64_t iteration) {
  ASSERT_GE(file.size(), 8u);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(file[i]);
  ASSERT_LE(header_len, file.size() - 8) << "iteration " << iteration;
  const uint64_t data_size = file.size() - 8 - header_len;
  uint64_t covered = 0;
  for (const SafetensorsEntry& e : es) {
    ASSERT_GE(e.offset, 0) << "iteration " << iteration;
    ASSERT_GE(e.nbytes, 0) << "iteration " << iteration;
    ASSERT_LE(static_cast<uint64_t>(e.offset) + static_cast<uint64_t>(e.nbytes), data_size)
        << "iteration " << iteration << " tensor " << e.name;
    ASSERT_LE(e.shape.rank, kMaxDims);
    ASSERT_EQ(e.shape.numel() * DTypeSize(e.dtype), e.nbytes) << "iteration " << iteration;
    covered += static_cast<uint64_t>(e.nbytes);
  }
  ASSERT_EQ(covered, data_size) << "iteration " << iteration;
}

TEST(SafetensorsFuzzTest, MutatedHeadersNeverCrashOrEscapeTheBuffer) {
  // Seeds: a synthetic file with every dtype and metadata, and the real golden fixture.
  std::mt19937 rng(5);
  std::vector<std::unique_ptr<HostTensor>> owned;
  std::vector<std::pair<std::string, TensorView>> tensors;
  const Shape shapes[] = {Shape{}, Shape{0}, Shape{3}, Shape{2, 3}, Shape{1, 2, 1, 2}};
  int i = 0;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kI32,
                      DType::kI64, DType::kU8}) {
    owned.push_back(std::make_unique<HostTensor>(dtype, shapes[i++ % 5], rng));
    tensors.emplace_back("model.layers." + std::to_string(i) + ".w", owned.back()->view);
  }
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir / "seed.safetensors", tensors, {{"format", "pt"}}).ok());

  struct Seed {
    std::string header, data;
  };
  std::vector<Seed> seeds;
  for (const std::string& path : {dir / "seed.safetensors", std::string(kMoeGolden)}) {
    std::string raw = ReadBytes(path);
    ASSERT_GE(raw.size(), 8u) << path;
    uint64_t n = 0;
    for (int b = 7; b >= 0; --b) n = (n << 8) | static_cast<uint8_t>(raw[b]);
    seeds.push_back({raw.substr(8, n), raw.substr(8 + n)});
    ASSERT_TRUE(Parse(raw).ok()) << path;  // seeds start valid
  }

  HeaderMutator mutator(20240611);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  constexpr uint64_t kMaxIterations = 200'000;
  uint64_t accepted = 0, rejected = 0, iteration = 0;
  for (; iteration < kMaxIterations; ++iteration) {
    if (iteration % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
    // The big fixture is slow to copy; use it for one input in sixteen.
    const Seed& seed = seeds[iteration % 16 == 0 ? 1 : 0];
    std::string file = mutator.Mutate(seed.header, seed.data);
    std::map<std::string, std::string> metadata;
    auto r = Parse(file, &metadata);
    if (r.ok()) {
      ++accepted;
      ExpectAcceptedEntriesInside(file, *r, iteration);
      if (HasFatalFailure()) return;
    } else {
      ++rejected;
      EXPECT_FALSE(r.status().message().empty());
    }
  }
  std::printf("fuzz: %llu inputs, %llu accepted, %llu rejected\n",
              static_cast<unsigned long long>(iteration), static_cast<unsigned long long>(accepted),
              static_cast<unsigned long long>(rejected));
  EXPECT_GT(iteration, 1000u) << "too few inputs tried to mean anything";
  EXPECT_GT(accepted, 0u) << "the mutator never produced a valid file; it explores nothing";
  EXPECT_GT(rejected, 0u);
}

}  // namespace
}  // namespace corolla
