#include "model/weights.h"

#include <cstdlib>
#include <cstring>

#include "base/numeric.h"

namespace corolla {
namespace {

bool IsFloat(DType t) { return t == DType::kBF16 || t == DType::kF16 || t == DType::kF32; }

}  // namespace

Result<TensorView> WeightLoader::FindShard(const std::string& name, const Shape& expected, const Shard& shard) {
  const SafetensorsEntry* entry = checkpoint_.Find(name);
  if (entry == nullptr)
    return NotFound("tensor " + name + ": missing from the checkpoint (expected " +
                    expected.ToString() + ")");
  ASSIGN_OR_RETURN(TensorView view, checkpoint_.Get(name));
  const bool fp8 = view.dtype == DType::kF8E4M3;
  if (view.shape != expected || !(IsFloat(view.dtype) || fp8))
    return InvalidArgument("tensor " + name + ": expected " + expected.ToString() +
                           " bf16/f16/f32/f8_e4m3, got " + view.ToString());
  used_.insert(name);
  if (shard.dim >= 0 && (shard.dim > 1 || view.rank() < shard.dim + 1 || shard.begin < 0 ||
                         shard.begin > shard.end || shard.end > view.dim(shard.dim)))
    return InvalidArgument("tensor " + name + ": shard [" + std::to_string(shard.begin) + ", " +
                           std::to_string(shard.end) + ") of dim " + std::to_string(shard.dim) +
                           " does not fit " + view.ToString());
  if (fp8) return DequantizeFp8(name, view, shard);
  if (shard.dim < 0) return view;
  if (shard.dim == 0) return view.Slice(shard.begin, shard.end);
  // Columns of a row-major [rows, cols] matrix: gathered row by row.
  if (view.rank() != 2) return InvalidArgument("tensor " + name + ": column shards need a 2-D tensor, got " + view.ToString());
  const int64_t rows = view.dim(0), width = shard.end - shard.begin, esize = DTypeSize(view.dtype);
  Tensor part = Tensor::Empty(view.dtype, {rows, width});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(part.view().data) + r * width * esize,
                static_cast<const char*>(view.data) + (r * view.strides[0] + shard.begin) * esize, width * esize);
  scratch_.push_back(part);
  return part.view();
}

Result<TensorView> WeightLoader::DequantizeFp8(const std::string& name, const TensorView& w, const Shard& shard) {
  const std::string scale_name = name + "_scale_inv";
  if (w.rank() != 2 || !w.is_contiguous())
    return InvalidArgument("tensor " + name + ": fp8 weights must be 2-D, got " + w.ToString());
  const int64_t rows = w.dim(0), cols = w.dim(1);
  const int64_t br = fp8_block_rows_, bc = fp8_block_cols_;
  const Shape scale_shape{(rows + br - 1) / br, (cols + bc - 1) / bc};
  const SafetensorsEntry* entry = checkpoint_.Find(scale_name);
  if (entry == nullptr)
    return NotFound("tensor " + scale_name + ": missing from the checkpoint (the scales of fp8 " + name + ")");
  ASSIGN_OR_RETURN(TensorView scale, checkpoint_.Get(scale_name));
  if (scale.shape != scale_shape || scale.dtype != DType::kF32)
    return InvalidArgument("tensor " + scale_name + ": expected " + scale_shape.ToString() + " f32, got " +
                           scale.ToString());
  used_.insert(scale_name);
  // Rows [r0, r1) x columns [c0, c1) of the whole tensor; w[i, j] * scale[i / br, j / bc] with
  // global i, j, so blocks cut by the shard (or partial at the tensor's end) keep their scale.
  const int64_t r0 = shard.dim == 0 ? shard.begin : 0, r1 = shard.dim == 0 ? shard.end : rows;
  const int64_t c0 = shard.dim == 1 ? shard.begin : 0, c1 = shard.dim == 1 ? shard.end : cols;
  const int64_t width = c1 - c0;
  Tensor out = Tensor::Empty(DType::kF32, {r1 - r0, width});
  const uint8_t* q = w.ptr<uint8_t>();
  const float* s = scale.ptr<float>();
  float lut[256];
  for (int b = 0; b < 256; ++b) lut[b] = ToFloat(fp8e4m3::FromBits(static_cast<uint8_t>(b)));
  for (int64_t i = r0; i < r1; ++i) {
    const float* block_scales = s + (i / br) * scale_shape[1];
    float* dst = out.ptr<float>() + (i - r0) * width;
    for (int64_t j = c0; j < c1; ++j) dst[j - c0] = lut[q[i * cols + j]] * block_scales[j / bc];
  }
  scratch_.push_back(out);
  return out.view();
}

void WeightLoader::MarkUsed(const std::string& name) {
  if (checkpoint_.Has(name)) used_.insert(name);
  if (checkpoint_.Has(name + "_scale_inv")) used_.insert(name + "_scale_inv");
}

Result<Tensor> WeightLoader::Load(const std::string& name, const Shape& expected, const Shard& shard) {
  ASSIGN_OR_RETURN(TensorView view, FindShard(name, expected, shard));
  Tensor t = backend_.LoadWeight(view);
  scratch_.clear();
  return t;
}

Result<Tensor> WeightLoader::LoadHost(const std::string& name, const Shape& expected, const Shard& shard) {
  ASSIGN_OR_RETURN(TensorView view, FindShard(name, expected, shard));
  Tensor host = MakeCpuBackend()->LoadWeight(view);  // the CPU backend's format is host f32
  scratch_.clear();
  return host;
}

Result<Tensor> WeightLoader::LoadConcat(const std::vector<std::string>& names,
                                        const std::vector<Shape>& expected, const std::vector<Shard>& shards) {
  COROLLA_CHECK(shards.empty() || shards.size() == names.size());
  std::vector<TensorView> views;
  for (size_t i = 0; i < names.size(); ++i) {
    ASSIGN_OR_RETURN(TensorView view, FindShard(names[i], expected[i], shards.empty() ? Shard{} : shards[i]));
    views.push_back(view);
  }
  Tensor t = backend_.LoadWeightConcat(views);
  scratch_.clear();
  return t;
}

Result<bool> NativeFp8Requested(const Backend& backend) {
  const char* v = std::getenv("COROLLA_FP8");
  // Default: native on CUDA, where with the routed experts FP8 too (Backend::MoeExpertsFp8) a
  // DeepSeek-V3 decode step is 1.12-1.63x faster than dequantised bf16 (5 layers, batch 1-128,
  // H200), prefill-sized GEMMs run at 42-90% of the FP8 peak, and the weights take half the
  // memory (the full model does not fit 8 H200 in bf16); dequant on the CPU, whose f32 forward
  // of the dequantised weights is what the goldens are.
  if (v == nullptr || *v == '\0') return backend.device() == Device::kCuda;
  if (std::string(v) == "native") return true;
  if (std::string(v) == "dequant") return false;
  return InvalidArgument(std::string("--fp8 / COROLLA_FP8 ") + v + ": expected native or dequant");
}

bool WeightLoader::NativeFp8(const std::string& name, const Shape& expected, const Shard& shard,
                             std::string* why) const {
  why->clear();
  if (!native_fp8_ || !checkpoint_.Has(name + "_scale_inv")) return false;
  Result<TensorView> view = checkpoint_.Get(name);
  if (!view.ok() || view->dtype != DType::kF8E4M3 || view->shape != expected || view->rank() != 2) return false;
  auto no = [&](const std::string& reason) {
    *why = name + " (" + reason + ")";
    return false;
  };
  if (fp8_block_rows_ != kFp8Block || fp8_block_cols_ != kFp8Block) return no("scale blocks are not 128 x 128");
  if (shard.dim >= 0 && shard.begin % kFp8Block != 0) return no("its shard starts inside a 128 block");
  const int64_t rows = shard.dim == 0 ? shard.end - shard.begin : expected[0];
  const int64_t cols = shard.dim == 1 ? shard.end - shard.begin : expected[1];
  if (!backend_.supports_linear_fp8(rows, cols))
    return no("the " + backend_.name() + " backend's FP8 linear does not take [" + std::to_string(rows) + ", " +
              std::to_string(cols) + "]");
  return true;
}

Result<LinearWeight> WeightLoader::LoadLinear(const std::string& name, const Shape& expected, const Shard& shard) {
  return LoadLinearConcat({name}, {expected}, {shard});
}

// FP8 parts: each shard's bytes and its block-row range of the scales; consecutive parts share
// one upload while the rows gathered so far fill whole 128-row blocks.
Result<LinearWeight> WeightLoader::LoadLinearConcat(const std::vector<std::string>& names,
                                                    const std::vector<Shape>& expected,
                                                    const std::vector<Shard>& shards) {
  COROLLA_CHECK(names.size() == expected.size() && (shards.empty() || shards.size() == names.size()));
  auto shard_of = [&](size_t i) { return shards.empty() ? Shard{} : shards[i]; };
  LinearWeight out;
  bool native = true;
  std::vector<std::string> why_not;
  for (size_t i = 0; i < names.size(); ++i) {
    std::string why;
    if (!NativeFp8(names[i], expected[i], shard_of(i), &why)) {
      native = false;
      if (!why.empty()) why_not.push_back(why);
    }
  }
  if (!native) {
    for (const std::string& why : why_not) dequantised_fp8_.push_back(why);
    ASSIGN_OR_RETURN(out.dense, LoadConcat(names, expected, shards));
    out.rows = out.dense.dim(0);
    out.cols = out.dense.dim(1);
    return out;
  }
  struct Piece {
    TensorView w;             // host [rows, cols] e4m3 (scratch or the file)
    TensorView scale;         // the whole tensor's scales [rb, cb]
    int64_t row0, col0;       // the shard's first row / column in the whole tensor
  };
  std::vector<Piece> pieces;
  for (size_t i = 0; i < names.size(); ++i) {
    const Shard sh = shard_of(i);
    ASSIGN_OR_RETURN(TensorView w, checkpoint_.Get(names[i]));
    ASSIGN_OR_RETURN(TensorView scale, checkpoint_.Get(names[i] + "_scale_inv"));
    const Shape scale_shape{(w.dim(0) + kFp8Block - 1) / kFp8Block, (w.dim(1) + kFp8Block - 1) / kFp8Block};
    if (scale.shape != scale_shape || scale.dtype != DType::kF32 || !w.is_contiguous())
      return InvalidArgument("tensor " + names[i] + "_scale_inv: expected " + scale_shape.ToString() + " f32, got " +
                             scale.ToString());
    used_.insert(names[i]);
    used_.insert(names[i] + "_scale_inv");
    Piece p{w, scale, sh.dim == 0 ? sh.begin : 0, sh.dim == 1 ? sh.begin : 0};
    if (sh.dim == 0) p.w = w.Slice(sh.begin, sh.end);
    if (sh.dim == 1) {  // columns: gathered row by row
      const int64_t rows = w.dim(0), width = sh.end - sh.begin;
      Tensor part = Tensor::Empty(DType::kF8E4M3, {rows, width});
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(part.ptr<uint8_t>() + r * width, w.ptr<uint8_t>() + r * w.dim(1) + sh.begin, width);
      scratch_.push_back(part);
      p.w = part.view();
    }
    pieces.push_back(p);
  }
  const int64_t cols = pieces[0].w.dim(1), groups = (cols + kFp8Block - 1) / kFp8Block, ld = Fp8ScaleStride(cols);
  for (const Piece& p : pieces)
    if (p.w.dim(1) != cols)
      return InvalidArgument("fused projection " + names[0] + ": parts of " + std::to_string(cols) + " and " +
                             std::to_string(p.w.dim(1)) + " columns");
  // Uploads pieces [begin, end) as one part.
  auto upload = [&](size_t begin, size_t end) {
    int64_t rows = 0;
    for (size_t i = begin; i < end; ++i) rows += pieces[i].w.dim(0);
    Tensor bytes = Tensor::Empty(DType::kF8E4M3, {rows, cols});
    Tensor scales = Tensor::Zeros(DType::kF32, {(rows + kFp8Block - 1) / kFp8Block, ld});
    int64_t r = 0;
    for (size_t i = begin; i < end; ++i) {
      const Piece& p = pieces[i];
      const int64_t n = p.w.dim(0);
      std::memcpy(bytes.ptr<uint8_t>() + r * cols, p.w.data, n * cols);
      // Block row b of this piece is block row (row0 / 128 + b) of its tensor, columns from col0 / 128.
      for (int64_t b = 0; b < (n + kFp8Block - 1) / kFp8Block; ++b)
        for (int64_t g = 0; g < groups; ++g)
          scales.ptr<float>()[(r / kFp8Block + b) * ld + g] =
              p.scale.ptr<float>()[(p.row0 / kFp8Block + b) * p.scale.dim(1) + p.col0 / kFp8Block + g];
      r += n;
    }
    LinearWeight::Fp8Part part;
    part.w = backend_.Empty(DType::kF8E4M3, {rows, cols});
    backend_.CopyFromHost(bytes.view().data, part.w);
    part.scale = backend_.Empty(DType::kF32, scales.shape());
    backend_.CopyFromHost(scales.view().data, part.scale);
    backend_.Synchronize();  // the host buffers die here
    part.first_row = out.rows;
    out.rows += rows;
    out.fp8.push_back(std::move(part));
  };
  size_t begin = 0;
  int64_t rows_so_far = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i > begin && rows_so_far % kFp8Block != 0) {
      upload(begin, i);
      begin = i;
      rows_so_far = 0;
    }
    rows_so_far += pieces[i].w.dim(0);
  }
  upload(begin, pieces.size());
  out.cols = cols;
  num_native_fp8_ += static_cast<int>(names.size());
  scratch_.clear();
  return out;
}

void RunLinear(Backend& backend, const TensorView& x, const LinearWeight& w, const TensorView& out) {
  if (!w.is_fp8()) return backend.Linear(x, w.dense, out);
  COROLLA_CHECK(out.rank() == 2 && out.dim(1) == w.rows) << "linear out " << out.ToString() << " for " << w.rows << " rows";
  for (const LinearWeight::Fp8Part& part : w.fp8) {
    const int64_t rows = part.w.dim(0);
    TensorView cols = out;  // columns [first_row, + rows) of every row of out
    cols.data = static_cast<char*>(out.data) + part.first_row * DTypeSize(out.dtype);
    cols.shape.dims[1] = rows;
    TensorView scale = part.scale.view();
    scale.shape.dims[1] = (w.cols + kFp8Block - 1) / kFp8Block;
    backend.LinearFp8(x, part.w, scale, cols);
  }
}

Result<Tensor> WeightLoader::LoadExpertsGateUp(const std::string& prefix, int num_experts,
                                               int inter, int hidden, int first_expert, int num_local) {
  if (num_local < 0) num_local = num_experts - first_expert;
  COROLLA_CHECK(first_expert >= 0 && first_expert + num_local <= num_experts);
  if (checkpoint_.Has(prefix + "gate_up_proj")) {
    ASSIGN_OR_RETURN(TensorView view, Find(prefix + "gate_up_proj", {num_experts, 2 * inter, hidden}));
    return backend_.LoadWeight(view.Slice(first_expert, first_expert + num_local));
  }
  // Per-expert: gate then up rows of each expert, experts in order -> [E * 2I, H] -> [E, 2I, H].
  std::vector<TensorView> views;
  for (int e = 0; e < num_experts; ++e) {
    std::string p = prefix + std::to_string(e) + ".";
    if (e < first_expert || e >= first_expert + num_local) {
      MarkUsed(p + "gate_proj.weight");
      MarkUsed(p + "up_proj.weight");
      continue;
    }
    ASSIGN_OR_RETURN(TensorView gate, Find(p + "gate_proj.weight", {inter, hidden}));
    ASSIGN_OR_RETURN(TensorView up, Find(p + "up_proj.weight", {inter, hidden}));
    views.push_back(gate);
    views.push_back(up);
  }
  Tensor t = backend_.LoadWeightConcat(views).Reshaped({num_local, 2 * inter, hidden});
  scratch_.clear();
  return t;
}

Result<Tensor> WeightLoader::LoadExpertsDown(const std::string& prefix, int num_experts, int inter,
                                             int hidden, int first_expert, int num_local) {
  if (num_local < 0) num_local = num_experts - first_expert;
  COROLLA_CHECK(first_expert >= 0 && first_expert + num_local <= num_experts);
  if (checkpoint_.Has(prefix + "down_proj")) {
    ASSIGN_OR_RETURN(TensorView view, Find(prefix + "down_proj", {num_experts, hidden, inter}));
    return backend_.LoadWeight(view.Slice(first_expert, first_expert + num_local));
  }
  std::vector<TensorView> views;
  for (int e = 0; e < num_experts; ++e) {
    if (e < first_expert || e >= first_expert + num_local) {
      MarkUsed(prefix + std::to_string(e) + ".down_proj.weight");
      continue;
    }
    ASSIGN_OR_RETURN(TensorView down,
                     Find(prefix + std::to_string(e) + ".down_proj.weight", {hidden, inter}));
    views.push_back(down);
  }
  Tensor t = backend_.LoadWeightConcat(views).Reshaped({num_local, hidden, inter});
  scratch_.clear();
  return t;
}

Result<bool> WeightLoader::LoadExpertsFp8(const std::string& prefix, int num_experts, int inter, int hidden,
                                          int first_expert, int num_local, ExpertsFp8* out) {
  if (num_local < 0) num_local = num_experts - first_expert;
  COROLLA_CHECK(first_expert >= 0 && first_expert + num_local <= num_experts);
  if (!native_fp8_ || num_local == 0) return false;
  const char* kParts[] = {"gate_proj", "up_proj", "down_proj"};
  // FP8 with scales, per expert (the first local expert decides; each is checked below).
  const std::string first = prefix + std::to_string(first_expert) + ".";
  for (const char* part : kParts) {
    Result<TensorView> v = checkpoint_.Get(first + part + ".weight");
    if (!v.ok() || v->dtype != DType::kF8E4M3 || !checkpoint_.Has(first + part + ".weight_scale_inv")) return false;
  }
  auto no = [&](const std::string& reason) -> Result<bool> {
    dequantised_fp8_.push_back(prefix + "* (" + reason + ")");
    return false;
  };
  if (fp8_block_rows_ != kFp8Block || fp8_block_cols_ != kFp8Block) return no("scale blocks are not 128 x 128");
  if (!backend_.supports_moe_fp8(hidden, inter))
    return no("the " + backend_.name() + " backend's FP8 experts do not take H " + std::to_string(hidden) + ", I " +
              std::to_string(inter));
  const int64_t h = hidden, i = inter, hb = (h + kFp8Block - 1) / kFp8Block, ib = (i + kFp8Block - 1) / kFp8Block;
  const int64_t el = num_local;
  out->gate_up = backend_.Empty(DType::kF8E4M3, {el, 2 * i, h});
  out->down = backend_.Empty(DType::kF8E4M3, {el, h, i});
  Tensor gus = Tensor::Empty(DType::kF32, {el, 2 * ib, hb}), ds = Tensor::Empty(DType::kF32, {el, hb, ib});
  // One e4m3 matrix (checked) straight from the file into `dst`, its scales into `scale_dst`.
  auto take = [&](const std::string& name, const Shape& shape, const TensorView& dst, float* scale_dst) -> Status {
    ASSIGN_OR_RETURN(TensorView w, checkpoint_.Get(name));
    ASSIGN_OR_RETURN(TensorView scale, checkpoint_.Get(name + "_scale_inv"));
    const Shape scale_shape{(shape[0] + kFp8Block - 1) / kFp8Block, (shape[1] + kFp8Block - 1) / kFp8Block};
    if (w.dtype != DType::kF8E4M3 || w.shape != shape || !w.is_contiguous())
      return InvalidArgument("tensor " + name + ": expected " + shape.ToString() + " f8_e4m3, got " + w.ToString());
    if (scale.dtype != DType::kF32 || scale.shape != scale_shape || !scale.is_contiguous())
      return InvalidArgument("tensor " + name + "_scale_inv: expected " + scale_shape.ToString() + " f32, got " +
                             scale.ToString());
    used_.insert(name);
    used_.insert(name + "_scale_inv");
    backend_.CopyFromHost(w.data, dst);
    std::memcpy(scale_dst, scale.data, scale_shape.numel() * sizeof(float));
    return Status::Ok();
  };
  for (int e = 0; e < num_experts; ++e) {
    const std::string p = prefix + std::to_string(e) + ".";
    if (e < first_expert || e >= first_expert + num_local) {
      for (const char* part : kParts) MarkUsed(p + part + ".weight");
      continue;
    }
    const int64_t l = e - first_expert;
    const TensorView gu = out->gate_up.view().Index(l);  // [2I, H]: gate rows, then up rows
    RETURN_IF_ERROR(take(p + "gate_proj.weight", {i, h}, gu.Slice(0, i), gus.ptr<float>() + l * 2 * ib * hb));
    RETURN_IF_ERROR(
        take(p + "up_proj.weight", {i, h}, gu.Slice(i, 2 * i), gus.ptr<float>() + (l * 2 * ib + ib) * hb));
    RETURN_IF_ERROR(take(p + "down_proj.weight", {h, i}, out->down.view().Index(l), ds.ptr<float>() + l * hb * ib));
  }
  out->gate_up_scale = backend_.Empty(DType::kF32, gus.shape());
  backend_.CopyFromHost(gus.view().data, out->gate_up_scale);
  out->down_scale = backend_.Empty(DType::kF32, ds.shape());
  backend_.CopyFromHost(ds.view().data, out->down_scale);
  backend_.Synchronize();  // the host scale buffers die here
  num_native_fp8_ += 3 * num_local;
  return true;
}

Status WeightLoader::CheckAllUsed(const std::function<bool(const std::string&)>& ignore) const {
  std::vector<std::string> unused;
  for (const std::string& name : checkpoint_.Names())
    if (!used_.count(name) && !ignore(name)) unused.push_back(name);
  if (unused.empty()) return Status::Ok();
  std::string msg = std::to_string(unused.size()) + " unexpected tensor(s) in the checkpoint: ";
  for (size_t i = 0; i < unused.size() && i < 8; ++i) msg += (i ? ", " : "") + unused[i];
  if (unused.size() > 8) msg += ", ...";
  return InvalidArgument(msg);
}

}  // namespace corolla
