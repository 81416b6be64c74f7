#include "model/gated_deltanet.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

namespace corolla {
namespace {

// Columns [begin, begin + width) of every row of a 2-D view.
TensorView Columns(const TensorView& x, int64_t begin, int64_t width) {
  TensorView v = x;
  v.data = static_cast<char*>(x.data) + begin * DTypeSize(x.dtype);
  v.shape.dims[1] = width;
  return v;
}

// Columns viewed as [T, heads, dim].
TensorView HeadColumns(const TensorView& x, int64_t begin, int64_t heads, int64_t dim) {
  TensorView v = Columns(x, begin, heads * dim);
  v.shape = {x.dim(0), heads, dim};
  v.strides = {x.strides[0], dim, 1, 0};
  return v;
}

// Elements [begin, end) of a small 1-D parameter, kept in f32 on the device.
Result<Tensor> LoadF32(WeightLoader& w, Backend& backend, const std::string& name, int64_t n,
                       int64_t begin, int64_t end) {
  ASSIGN_OR_RETURN(Tensor host, w.LoadHost(name, {n}));
  Tensor t = backend.Empty(DType::kF32, {end - begin});
  backend.CopyFromHost(host.ptr<float>() + begin, t);
  return t;
}

// Rows [begin, end) of checkpoint tensor `name`, whose whole shape is `shape`.
struct RowRange {
  std::string name;
  Shape shape;
  int64_t begin, end;
};

// The ranges' rows concatenated, as one weight. Assembled in host f32 so that each tensor is
// read (widened, or dequantised when FP8) once however many of its ranges are taken: Qwen3-Next's
// in_proj_qkvz gives six per key head.
Result<Tensor> LoadRows(WeightLoader& w, Backend& backend, const std::vector<RowRange>& ranges) {
  COROLLA_CHECK(!ranges.empty());
  auto row_size = [](const Shape& s) { return s[0] > 0 ? s.numel() / s[0] : 0; };
  std::map<std::string, Tensor> host;
  Shape shape = ranges[0].shape;  // of the result: the rows taken, the trailing dims of every range
  shape.dims[0] = 0;
  const int64_t row = row_size(ranges[0].shape);
  for (const RowRange& r : ranges) {
    COROLLA_CHECK(r.shape.rank == shape.rank && row_size(r.shape) == row)
        << r.name << " " << r.shape.ToString();
    if (!host.count(r.name)) {
      ASSIGN_OR_RETURN(Tensor t, w.LoadHost(r.name, r.shape));
      host.emplace(r.name, std::move(t));
    }
    shape.dims[0] += r.end - r.begin;
  }
  Tensor out = Tensor::Empty(DType::kF32, shape);
  float* dst = out.ptr<float>();
  for (const RowRange& r : ranges) {
    COROLLA_CHECK(0 <= r.begin && r.begin <= r.end && r.end <= r.shape[0]) << r.name;
    dst = std::copy_n(host.at(r.name).ptr<float>() + r.begin * row, (r.end - r.begin) * row, dst);
  }
  return backend.LoadWeight(out);
}

// The in_proj rows of `heads`, in the order q | k | v | z | b | a, each over the rank's heads.
// Qwen3.5 stores in_proj_qkv (q | k | v over all heads), in_proj_z, in_proj_b, in_proj_a.
// Qwen3-Next fuses them per key head g: in_proj_qkvz rows [q (Dk) | k (Dk) | v (r Dv) | z (r Dv)]
// and in_proj_ba rows [b (r) | a (r)], r = Hv / Hk.
std::vector<RowRange> InProjRows(WeightLoader& w, const ModelConfig& c, const LinearHeads& heads,
                                 const std::string& p) {
  const LinearAttentionConfig& la = c.linear;
  const int64_t hidden = c.hidden_size, hk = la.num_key_heads, hv = la.num_value_heads;
  const int64_t dk = la.key_head_dim, dv = la.value_head_dim, r = hv / hk;
  const int64_t kd = la.key_dim(), vd = la.value_dim();
  const int64_t k0 = heads.first_key_head, k1 = k0 + heads.num_key_heads;
  const int64_t v0 = heads.first_value_head, v1 = v0 + heads.num_value_heads;
  if (!w.Has(p + "in_proj_qkvz.weight")) {
    const std::string qkv = p + "in_proj_qkv.weight";
    const Shape qkv_shape{la.conv_channels(), hidden};
    return {{qkv, qkv_shape, k0 * dk, k1 * dk},
            {qkv, qkv_shape, kd + k0 * dk, kd + k1 * dk},
            {qkv, qkv_shape, 2 * kd + v0 * dv, 2 * kd + v1 * dv},
            {p + "in_proj_z.weight", {vd, hidden}, v0 * dv, v1 * dv},
            {p + "in_proj_b.weight", {hv, hidden}, v0, v1},
            {p + "in_proj_a.weight", {hv, hidden}, v0, v1}};
  }
  const std::string qkvz = p + "in_proj_qkvz.weight", ba = p + "in_proj_ba.weight";
  const Shape qkvz_shape{2 * kd + 2 * vd, hidden}, ba_shape{2 * hv, hidden};
  const int64_t group = 2 * dk + 2 * r * dv;  // rows of one key head in in_proj_qkvz
  std::vector<RowRange> rows;
  // One range per key head g of the rank: range(g, j0, j1) for the rank's value heads
  // [j0, j1) of g's group (all r of them unless key heads are replicated).
  auto per_key_head = [&](const std::string& name, const Shape& shape, auto range) {
    for (int64_t g = k0; g < k1; ++g) {
      const int64_t j0 = std::max(v0, g * r) - g * r, j1 = std::min(v1, (g + 1) * r) - g * r;
      const auto [begin, end] = range(g, j0, j1);
      rows.push_back({name, shape, begin, end});
    }
  };
  using Rows = std::pair<int64_t, int64_t>;
  per_key_head(qkvz, qkvz_shape, [&](int64_t g, int64_t, int64_t) {  // q
    return Rows{g * group, g * group + dk};
  });
  per_key_head(qkvz, qkvz_shape, [&](int64_t g, int64_t, int64_t) {  // k
    return Rows{g * group + dk, g * group + 2 * dk};
  });
  per_key_head(qkvz, qkvz_shape, [&](int64_t g, int64_t j0, int64_t j1) {  // v
    const int64_t v = g * group + 2 * dk;
    return Rows{v + j0 * dv, v + j1 * dv};
  });
  per_key_head(qkvz, qkvz_shape, [&](int64_t g, int64_t j0, int64_t j1) {  // z
    const int64_t z = g * group + 2 * dk + r * dv;
    return Rows{z + j0 * dv, z + j1 * dv};
  });
  per_key_head(ba, ba_shape, [&](int64_t g, int64_t j0, int64_t j1) {  // b
    return Rows{2 * r * g + j0, 2 * r * g + j1};
  });
  per_key_head(ba, ba_shape, [&](int64_t g, int64_t j0, int64_t j1) {  // a
    return Rows{2 * r * g + r + j0, 2 * r * g + r + j1};
  });
  return rows;
}

}  // namespace

Result<LinearHeads> PlanLinearHeads(const LinearAttentionConfig& la, int tp, int rank) {
  const int hk = la.num_key_heads, hv = la.num_value_heads;
  auto fail = [&](int n, const std::string& what) {
    return InvalidArgument(std::to_string(n) + " linear " + what + " do not split over " +
                           std::to_string(tp) + " ranks");
  };
  if (hk <= 0 || hv % hk != 0)
    return InvalidArgument(std::to_string(hv) + " linear value heads are not a multiple of " +
                           std::to_string(hk) + " linear key heads");
  LinearHeads h;
  if (hv % tp != 0) return fail(hv, "value heads (linear_num_value_heads)");
  h.num_value_heads = hv / tp;
  h.first_value_head = rank * h.num_value_heads;
  if (hk >= tp) {
    if (hk % tp != 0) return fail(hk, "key heads (linear_num_key_heads)");
    h.num_key_heads = hk / tp;
    h.first_key_head = rank * h.num_key_heads;
  } else {  // one key head, replicated over the tp / hk ranks that split its value heads
    if (tp % hk != 0) return fail(hk, "key heads (linear_num_key_heads)");
    h.num_key_heads = 1;
    h.first_key_head = h.first_value_head / (hv / hk);
  }
  return h;
}

Status LoadGatedDeltaNet(WeightLoader& w, Backend& backend, const ModelConfig& c,
                         const LinearHeads& heads, const std::string& p,
                         GatedDeltaNetWeights* out) {
  const LinearAttentionConfig& la = c.linear;
  const int64_t hidden = c.hidden_size, hv = la.num_value_heads;
  const int64_t dk = la.key_head_dim, dv = la.value_head_dim, kd = la.key_dim();
  const int64_t k0 = heads.first_key_head, k1 = k0 + heads.num_key_heads;
  const int64_t v0 = heads.first_value_head, v1 = v0 + heads.num_value_heads;
  out->heads = heads;
  // One projection for everything the layer reads from its input.
  ASSIGN_OR_RETURN(out->in_proj, LoadRows(w, backend, InProjRows(w, c, heads, p)));
  // Conv channels are q | k | v over all heads in both layouts.
  const std::string conv = p + "conv1d.weight";
  const Shape conv_shape{la.conv_channels(), 1, la.conv_kernel};
  ASSIGN_OR_RETURN(Tensor conv_w,
                   LoadRows(w, backend,
                            {{conv, conv_shape, k0 * dk, k1 * dk},
                             {conv, conv_shape, kd + k0 * dk, kd + k1 * dk},
                             {conv, conv_shape, 2 * kd + v0 * dv, 2 * kd + v1 * dv}}));
  out->conv = conv_w.Reshaped({heads.conv_channels(la), la.conv_kernel});
  ASSIGN_OR_RETURN(out->a_log, LoadF32(w, backend, p + "A_log", hv, v0, v1));
  ASSIGN_OR_RETURN(out->dt_bias, LoadF32(w, backend, p + "dt_bias", hv, v0, v1));
  ASSIGN_OR_RETURN(out->norm, w.Load(p + "norm.weight", {la.value_head_dim}));
  ASSIGN_OR_RETURN(out->out_proj, w.Load(p + "out_proj.weight", {hidden, la.value_dim()},
                                         Shard::Cols(v0 * dv, v1 * dv)));
  return Status::Ok();
}

void GatedDeltaNetForward(Backend& backend, const ModelConfig& c, const GatedDeltaNetWeights& w,
                          const TensorView& x, const ForwardBatch& batch,
                          const LinearStateView& state, const TensorView& out) {
  const LinearAttentionConfig& la = c.linear;
  const int64_t tokens = x.dim(0), channels = w.heads.conv_channels(la), vd = w.heads.value_dim(la);
  const int64_t hk = w.heads.num_key_heads, hv = w.heads.num_value_heads;  // this rank's
  const int64_t dk = la.key_head_dim, dv = la.value_head_dim;
  const DType act = backend.activation_dtype();

  Tensor proj = backend.Empty(act, {tokens, channels + vd + 2 * hv});  // [T, q|k|v | z | b | a]
  backend.Linear(x, w.in_proj, proj);
  Tensor mixed = backend.Empty(act, {tokens, channels});  // [T, q|k|v] after conv + SiLU
  backend.CausalConv1d(Columns(proj, 0, channels), w.conv, state.conv, batch.state_slots,
                       batch.attention, mixed);

  Tensor core = backend.Empty(act, {tokens, hv, dv});  // [T, Hv, Dv]
  backend.GatedDeltaRule(HeadColumns(mixed, 0, hk, dk), HeadColumns(mixed, hk * dk, hk, dk),
                         HeadColumns(mixed, 2 * hk * dk, hv, dv),
                         Columns(proj, channels + vd + hv, hv), Columns(proj, channels + vd, hv),
                         w.a_log, w.dt_bias, state.recurrent, batch.state_slots, batch.attention,
                         core);
  Tensor normed = backend.Empty(act, {tokens, hv, dv});
  backend.GatedRmsNorm(core, HeadColumns(proj, channels, hv, dv), w.norm,
                       static_cast<float>(c.rms_norm_eps), normed);
  backend.Linear(normed.view().Reshape({tokens, vd}), w.out_proj, out);
}

}  // namespace corolla
