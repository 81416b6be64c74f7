// Safetensors checkpoints: SafetensorsFile is one read-only mmapped .safetensors file, Checkpoint
// a Hugging Face model directory (one file or index-listed shards), WriteSafetensors the writer.
// Files own their mapping (move-only, via unique_ptr); views into them stay valid while the file
// or checkpoint lives. Both are immutable after Open and safe to read from many threads.
//
// Layout of a file: [u64 little-endian N][N bytes of JSON header][data section]. The header maps
// each tensor name to {"dtype", "shape", "data_offsets": [begin, end)} with offsets relative to
// the data section, plus an optional "__metadata__" string->string map. As the reference
// `safetensors` crate does, the tensors must tile the data section exactly: no overlaps, no holes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace corolla {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  int64_t offset = 0;  // into the file's data section
  int64_t nbytes = 0;
};

class SafetensorsFile {
 public:
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Maps `path` read-only and validates its header; errors name the path.
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  // Validates a whole file held in memory (header length, JSON header, and that the tensors
  // tile the data section). Returns the entries ordered by offset; fills `metadata` from
  // "__metadata__" when given. Never reads outside [data, data + size).
  static Result<std::vector<SafetensorsEntry>> ParseHeader(
      const uint8_t* data, size_t size, std::map<std::string, std::string>* metadata = nullptr);

  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // by offset
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* Find(std::string_view name) const;
  // A host view over the mapped bytes. The mapping is PROT_READ: never write through it.
  // Tensors are aligned to their element size when the file came from the reference writer
  // (or WriteSafetensors); other writers may leave them unaligned.
  TensorView View(const SafetensorsEntry& e) const;
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;

  std::string path_;
  uint8_t* map_ = nullptr;  // whole file, munmapped by the destructor
  size_t map_size_ = 0;
  const uint8_t* data_section_ = nullptr;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in entries_
  std::map<std::string, std::string> metadata_;
};

// A Hugging Face model directory: model.safetensors.index.json (its weight_map names the shard
// of every tensor), else model.safetensors, else every *.safetensors in the directory.
class Checkpoint {
 public:
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  static Result<std::unique_ptr<Checkpoint>> Open(const std::string& dir);
  // A checkpoint over host views already in memory (random weights for benchmarks: see
  // model/random_weights.h). The views' memory must outlive the checkpoint; `dir` names it in errors.
  static std::unique_ptr<Checkpoint> FromViews(const std::string& dir,
                                               const std::vector<std::pair<std::string, TensorView>>& views);

  bool Has(std::string_view name) const { return Find(name) != nullptr; }
  Result<TensorView> Get(std::string_view name) const;  // NotFound naming the tensor
  const SafetensorsEntry* Find(std::string_view name) const;
  std::vector<std::string> Names() const;  // sorted
  const std::string& dir() const { return dir_; }

 private:
  struct Location {
    const SafetensorsFile* file;  // null for a view held in memory (FromViews)
    const SafetensorsEntry* entry;
    TensorView view{};            // FromViews only
  };
  Checkpoint() = default;

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Location, std::less<>> tensors_;
  std::vector<std::unique_ptr<SafetensorsEntry>> memory_entries_;  // FromViews' entries
};

// Writes host, contiguous tensors to `path` (through a temporary file renamed into place).
// Like the reference writer, tensors are laid out by decreasing element size, then name, so
// each is aligned to its element size, and the header is padded with spaces to a multiple of 8.
Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, TensorView>>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace corolla
