#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace corolla {

namespace {

using json = nlohmann::json;

// The reference crate's limit; a larger length prefix means garbage, not a header.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

constexpr const char* kSupportedDTypes = "BF16, F16, F32, F8_E4M3, I32, I64, U8";

// A short rendering of a JSON value for error messages (fuzzed headers can be huge).
std::string Excerpt(const json& j) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 64) s = s.substr(0, 61) + "...";
  return s;
}

std::string Range(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

// A JSON number that is a non-negative integer (not 1.0, not -1).
bool AsUnsigned(const json& j, uint64_t* out) {
  if (!j.is_number_unsigned()) return false;
  *out = j.get<uint64_t>();
  return true;
}

Result<SafetensorsEntry> ParseEntry(const std::string& name, const json& info, uint64_t data_size) {
  const std::string where = "tensor " + name + ": ";
  if (!info.is_object()) return Corrupt(where + "entry is not an object: " + Excerpt(info));
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!info.contains(key)) return Corrupt(where + "missing \"" + key + "\"");
  }
  SafetensorsEntry e;
  e.name = name;

  const json& dtype = info["dtype"];
  if (!dtype.is_string()) return Corrupt(where + "dtype is not a string: " + Excerpt(dtype));
  const std::string& dtype_name = dtype.get_ref<const std::string&>();
  if (!ParseDType(dtype_name, &e.dtype)) {
    return Unsupported(where + "dtype " + dtype_name +
                       " is not supported (supported: " + kSupportedDTypes + ")");
  }

  const json& shape = info["shape"];
  if (!shape.is_array()) {
    return Corrupt(where + "shape is not a list of non-negative integers: " + Excerpt(shape));
  }
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    return Unsupported(where + "rank " + std::to_string(shape.size()) + " exceeds kMaxDims (" +
                       std::to_string(kMaxDims) + ")");
  }
  int64_t numel = 1;
  bool overflow = false;
  for (const json& d : shape) {
    uint64_t dim;
    if (!AsUnsigned(d, &dim)) {
      return Corrupt(where + "shape is not a list of non-negative integers: " + Excerpt(shape));
    }
    if (dim > static_cast<uint64_t>(INT64_MAX)) {
      overflow = true;
      dim = 0;  // keep the shape well-defined; the error below reports it
    }
    e.shape.dims[e.shape.rank++] = static_cast<int64_t>(dim);
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(dim), &numel)) overflow = true;
  }
  int64_t needed_bytes = 0;
  if (overflow || __builtin_mul_overflow(numel, DTypeSize(e.dtype), &needed_bytes)) {
    return Corrupt(where + "shape " + Excerpt(shape) + " is too large (byte size overflows)");
  }

  const json& offsets = info["data_offsets"];
  uint64_t begin, end;
  if (!offsets.is_array() || offsets.size() != 2 || !AsUnsigned(offsets[0], &begin) ||
      !AsUnsigned(offsets[1], &end)) {
    return Corrupt(where + "data_offsets is not two non-negative integers: " + Excerpt(offsets));
  }
  if (begin > end) {
    return Corrupt(where + "data_offsets " + Range(begin, end) + " begin after they end");
  }
  if (end > data_size) {
    return Corrupt(where + "data_offsets " + Range(begin, end) + " extend past the data section (" +
                   std::to_string(data_size) + " bytes)");
  }
  e.offset = static_cast<int64_t>(begin);
  e.nbytes = static_cast<int64_t>(end - begin);
  if (e.nbytes != needed_bytes) {
    return Corrupt(where + "data_offsets " + Range(begin, end) + " hold " +
                   std::to_string(e.nbytes) + " bytes but " + e.shape.ToString() + " " +
                   dtype_name + " needs " + std::to_string(needed_bytes));
  }
  return e;
}

// Tensors sorted by offset must tile [0, data_size): no overlaps, no holes (as the crate checks).
Status CheckTiling(const std::vector<SafetensorsEntry>& entries, uint64_t data_size) {
  int64_t expected = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : entries) {
    if (e.offset < expected) {
      return Corrupt("tensor " + e.name + " at " + Range(e.offset, e.offset + e.nbytes) +
                     " overlaps tensor " + previous->name + " at " +
                     Range(previous->offset, previous->offset + previous->nbytes));
    }
    if (e.offset > expected) {
      return Corrupt("hole in the data section: bytes " + Range(expected, e.offset) +
                     " before tensor " + e.name + " belong to no tensor");
    }
    expected = e.offset + e.nbytes;
    previous = &e;
  }
  if (static_cast<uint64_t>(expected) != data_size) {
    return Corrupt("data section has " + std::to_string(data_size) + " bytes but its tensors " +
                   "cover only " + std::to_string(expected));
  }
  return Status::Ok();
}

std::string ErrnoMessage() { return std::strerror(errno); }

uint64_t ReadU64Le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

Result<std::vector<SafetensorsEntry>> SafetensorsFile::ParseHeader(
    const uint8_t* data, size_t size, std::map<std::string, std::string>* metadata) {
  if (size < 8) {
    return Corrupt("file is " + std::to_string(size) +
                   " bytes, shorter than the 8-byte header length");
  }
  const uint64_t header_len = ReadU64Le(data);
  if (header_len > kMaxHeaderBytes) {
    return Corrupt("header length " + std::to_string(header_len) + " is absurd (over " +
                   std::to_string(kMaxHeaderBytes) + " bytes)");
  }
  if (header_len > size - 8) {
    return Corrupt("header length " + std::to_string(header_len) +
                   " extends past the end of the file (" + std::to_string(size) + " bytes)");
  }
  const uint8_t* header_begin = data + 8;
  const uint8_t* header_end = header_begin + header_len;
  const uint64_t data_size = size - 8 - header_len;

  json header;
  try {
    header = json::parse(header_begin, header_end);
  } catch (const json::exception& ex) {
    return Corrupt(std::string("header is not valid JSON: ") + ex.what());
  }
  if (!header.is_object()) return Corrupt("header is not a JSON object: " + Excerpt(header));

  std::vector<SafetensorsEntry> entries;
  entries.reserve(header.size());
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) {
        return Corrupt("__metadata__ is not a map of strings to strings: " + Excerpt(info));
      }
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string()) {
          return Corrupt("__metadata__ is not a map of strings to strings: value of " + key +
                         " is " + Excerpt(value));
        }
        if (metadata) (*metadata)[key] = value.get<std::string>();
      }
      continue;
    }
    ASSIGN_OR_RETURN(SafetensorsEntry e, ParseEntry(name, info, data_size));
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  RETURN_IF_ERROR(CheckTiling(entries, data_size));
  return entries;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound(path + ": no such file");
    return InvalidArgument(path + ": cannot open: " + ErrnoMessage());
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string message = ErrnoMessage();
    ::close(fd);
    return Internal(path + ": fstat: " + message);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + ": not a regular file");
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_size_ = static_cast<size_t>(st.st_size);
  if (file->map_size_ > 0) {
    // Private read-only mapping: pages come from the page cache on first touch, so a rank that
    // reads only its shard of the experts never pulls in the rest. No madvise: access is by
    // tensor, whose order the loader decides, and the kernel's readahead suits either order.
    void* p = ::mmap(nullptr, file->map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      std::string message = ErrnoMessage();
      ::close(fd);
      return ResourceExhausted(path + ": mmap of " + std::to_string(file->map_size_) +
                               " bytes failed: " + message);
    }
    file->map_ = static_cast<uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive

  auto entries = ParseHeader(file->map_, file->map_size_, &file->metadata_);
  if (!entries.ok()) return entries.status().WithContext(path);
  file->entries_ = std::move(entries).value();
  file->data_section_ = file->map_ + 8 + ReadU64Le(file->map_);
  for (size_t i = 0; i < file->entries_.size(); ++i) file->index_[file->entries_[i].name] = i;
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const SafetensorsEntry* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

TensorView SafetensorsFile::View(const SafetensorsEntry& e) const {
  COROLLA_CHECK(data_section_ != nullptr && e.offset >= 0 &&
                data_section_ + e.offset + e.nbytes <= map_ + map_size_)
      << "entry " << e.name << " does not belong to " << path_;
  // The mapping is read-only; TensorView has no const flavour, so callers must not write.
  return TensorView(const_cast<uint8_t*>(data_section_ + e.offset), e.dtype, e.shape);
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

namespace {

namespace fs = std::filesystem;

Result<json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& ex) {
    return Corrupt(path + ": not valid JSON: " + ex.what());
  }
}

}  // namespace

Result<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFound(dir + ": not a directory");
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = dir;

  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  const std::string single_path = (fs::path(dir) / "model.safetensors").string();

  if (fs::exists(index_path, ec)) {
    ASSIGN_OR_RETURN(json index, ReadJsonFile(index_path));
    if (!index.is_object() || !index.contains("weight_map")) {
      return Corrupt(index_path + ": no weight_map");
    }
    const json& weight_map = index["weight_map"];
    if (!weight_map.is_object()) {
      return Corrupt(index_path + ": weight_map is not a map of tensor names to shard files");
    }
    std::map<std::string, const SafetensorsFile*> shards;
    for (const auto& [tensor, shard] : weight_map.items()) {
      if (!shard.is_string()) {
        return Corrupt(index_path + ": weight_map entry for " + tensor +
                       " is not a file name: " + Excerpt(shard));
      }
      const std::string& shard_name = shard.get_ref<const std::string&>();
      if (shard_name.empty() || shard_name.find('/') != std::string::npos || shard_name == "..") {
        return Corrupt(index_path + ": shard \"" + shard_name + "\" of tensor " + tensor +
                       " is not a file name in the directory");
      }
      auto it = shards.find(shard_name);
      if (it == shards.end()) {
        const std::string shard_path = (fs::path(dir) / shard_name).string();
        if (!fs::exists(shard_path, ec)) {
          return NotFound(index_path + ": shard " + shard_name + " (holding " + tensor +
                          ") is missing");
        }
        ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(shard_path));
        it = shards.emplace(shard_name, file.get()).first;
        ckpt->files_.push_back(std::move(file));
      }
      const SafetensorsEntry* entry = it->second->Find(tensor);
      if (!entry) {
        return Corrupt(index_path + ": weight_map puts tensor " + tensor + " in " + shard_name +
                       ", which does not contain it");
      }
      ckpt->tensors_[tensor] = Location{it->second, entry};
    }
    return ckpt;
  }

  std::vector<std::string> paths;
  if (fs::exists(single_path, ec)) {
    paths.push_back(single_path);
  } else {
    for (const auto& item : fs::directory_iterator(dir, ec)) {
      if (item.path().extension() == ".safetensors") paths.push_back(item.path().string());
    }
    if (ec) return InvalidArgument(dir + ": cannot list: " + ec.message());
    std::sort(paths.begin(), paths.end());
  }
  if (paths.empty()) {
    return NotFound(dir + ": no model.safetensors, model.safetensors.index.json or *.safetensors");
  }
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    for (const SafetensorsEntry& e : file->entries()) {
      auto [it, inserted] = ckpt->tensors_.emplace(e.name, Location{file.get(), &e});
      if (!inserted) {
        return Corrupt(dir + ": tensor " + e.name + " is in both " + it->second.file->path() +
                       " and " + path);
      }
    }
    ckpt->files_.push_back(std::move(file));
  }
  return ckpt;
}

const SafetensorsEntry* Checkpoint::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.entry;
}

Result<TensorView> Checkpoint::Get(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return NotFound("tensor " + std::string(name) + " not found in checkpoint " + dir_);
  }
  if (it->second.file == nullptr) return it->second.view;
  return it->second.file->View(*it->second.entry);
}

std::unique_ptr<Checkpoint> Checkpoint::FromViews(
    const std::string& dir, const std::vector<std::pair<std::string, TensorView>>& views) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = dir;
  for (const auto& [name, view] : views) {
    auto entry = std::make_unique<SafetensorsEntry>();
    entry->name = name;
    entry->dtype = view.dtype;
    entry->shape = view.shape;
    entry->nbytes = view.nbytes();
    ckpt->tensors_[name] = Location{nullptr, entry.get(), view};
    ckpt->memory_entries_.push_back(std::move(entry));
  }
  return ckpt;
}

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, location] : tensors_) names.push_back(name);
  return names;
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

Status WriteAll(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ResourceExhausted(path + ": write failed: " + ErrnoMessage());
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, TensorView>>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<const std::pair<std::string, TensorView>*> order;
  order.reserve(tensors.size());
  for (const auto& t : tensors) {
    const TensorView& v = t.second;
    if (t.first == "__metadata__") {
      return InvalidArgument(path + ": __metadata__ is reserved, not a tensor name");
    }
    if (v.device != Device::kCpu) {
      return InvalidArgument(path + ": tensor " + t.first + " is not in host memory");
    }
    if (!v.is_contiguous()) {
      return InvalidArgument(path + ": tensor " + t.first + " " + v.ToString() +
                             " is not contiguous");
    }
    if (v.nbytes() > 0 && v.data == nullptr) {
      return InvalidArgument(path + ": tensor " + t.first + " has no data");
    }
    order.push_back(&t);
  }
  // Largest element first, then by name: every tensor starts aligned to its element size.
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    int64_t sa = DTypeSize(a->second.dtype), sb = DTypeSize(b->second.dtype);
    return sa != sb ? sa > sb : a->first < b->first;
  });
  {
    std::vector<std::string_view> names;
    for (const auto& t : tensors) names.push_back(t.first);
    std::sort(names.begin(), names.end());
    if (auto dup = std::adjacent_find(names.begin(), names.end()); dup != names.end()) {
      return InvalidArgument(path + ": tensor " + std::string(*dup) + " given twice");
    }
  }

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto* t : order) {
    const TensorView& v = t->second;
    std::vector<int64_t> shape(v.shape.dims.begin(), v.shape.dims.begin() + v.shape.rank);
    header[t->first] = {{"dtype", DTypeName(v.dtype)},
                        {"shape", shape},
                        {"data_offsets", {offset, offset + v.nbytes()}}};
    offset += v.nbytes();
  }
  std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));

  const std::string tmp_path = path + ".tmp";
  int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return InvalidArgument(tmp_path + ": cannot create: " + ErrnoMessage());
  Status status = WriteAll(fd, length, sizeof(length), tmp_path);
  if (status.ok()) status = WriteAll(fd, text.data(), text.size(), tmp_path);
  for (const auto* t : order) {
    if (!status.ok()) break;
    status = WriteAll(fd, t->second.data, static_cast<size_t>(t->second.nbytes()), tmp_path);
  }
  if (::close(fd) != 0 && status.ok()) {
    status = ResourceExhausted(tmp_path + ": close failed: " + ErrnoMessage());
  }
  if (status.ok() && ::rename(tmp_path.c_str(), path.c_str()) != 0) {
    status =
        InvalidArgument(path + ": cannot rename " + tmp_path + " into place: " + ErrnoMessage());
  }
  if (!status.ok()) ::unlink(tmp_path.c_str());
  return status;
}

}  // namespace corolla
