#include "model/gated_deltanet.h"

#include <algorithm>

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

// A small parameter kept in f32 on the device.
Result<Tensor> LoadF32(WeightLoader& w, Backend& backend, const std::string& name, int64_t n) {
  ASSIGN_OR_RETURN(Tensor host, w.LoadHost(name, {n}));
  Tensor t = backend.Empty(DType::kF32, {n});
  backend.CopyFromHost(host.view().data, t);
  return t;
}

}  // namespace

// Qwen3-Next fuses the projections per key head: in_proj_qkvz rows are, for each key head g,
// [q (Dk) | k (Dk) | v (r Dv) | z (r Dv)] with r = Hv / Hk, and in_proj_ba rows [b (r) | a (r)].
// Reordered here into the layout Qwen3.5 stores: q | k | v | z | b | a, each over all heads.
Result<Tensor> LoadFusedQwen3NextProjection(WeightLoader& w, Backend& backend, const ModelConfig& c,
                                            const std::string& p) {
  const LinearAttentionConfig& la = c.linear;
  const int64_t hidden = c.hidden_size, hk = la.num_key_heads, hv = la.num_value_heads;
  const int64_t dk = la.key_head_dim, dv = la.value_head_dim, r = hv / hk;
  const int64_t kd = la.key_dim(), vd = la.value_dim();
  ASSIGN_OR_RETURN(Tensor qkvz, w.LoadHost(p + "in_proj_qkvz.weight", {2 * kd + 2 * vd, hidden}));
  ASSIGN_OR_RETURN(Tensor ba, w.LoadHost(p + "in_proj_ba.weight", {2 * hv, hidden}));
  Tensor out = Tensor::Empty(DType::kF32, {2 * kd + 2 * vd + 2 * hv, hidden});
  auto copy_rows = [&](const Tensor& src, int64_t src_row, int64_t dst_row, int64_t n) {
    std::copy_n(src.ptr<float>() + src_row * hidden, n * hidden, out.ptr<float>() + dst_row * hidden);
  };
  const int64_t group = 2 * dk + 2 * r * dv;
  for (int64_t g = 0; g < hk; ++g) {
    copy_rows(qkvz, g * group, g * dk, dk);                                       // q
    copy_rows(qkvz, g * group + dk, kd + g * dk, dk);                             // k
    copy_rows(qkvz, g * group + 2 * dk, 2 * kd + g * r * dv, r * dv);             // v
    copy_rows(qkvz, g * group + 2 * dk + r * dv, 2 * kd + vd + g * r * dv, r * dv);  // z
    copy_rows(ba, g * 2 * r, 2 * kd + 2 * vd + g * r, r);                         // b
    copy_rows(ba, g * 2 * r + r, 2 * kd + 2 * vd + hv + g * r, r);                // a
  }
  return backend.LoadWeight(out);
}

Status LoadGatedDeltaNet(WeightLoader& w, Backend& backend, const ModelConfig& c, const std::string& p,
                         GatedDeltaNetWeights* out) {
  const LinearAttentionConfig& la = c.linear;
  const int64_t hidden = c.hidden_size, hv = la.num_value_heads;
  // One projection for everything the layer reads from its input.
  if (w.Has(p + "in_proj_qkvz.weight")) {
    ASSIGN_OR_RETURN(out->in_proj, LoadFusedQwen3NextProjection(w, backend, c, p));
  } else {
    ASSIGN_OR_RETURN(out->in_proj,
                     w.LoadConcat({p + "in_proj_qkv.weight", p + "in_proj_z.weight", p + "in_proj_b.weight",
                                   p + "in_proj_a.weight"},
                                  {{la.conv_channels(), hidden}, {la.value_dim(), hidden}, {hv, hidden}, {hv, hidden}}));
  }
  ASSIGN_OR_RETURN(Tensor conv, w.Load(p + "conv1d.weight", {la.conv_channels(), 1, la.conv_kernel}));
  out->conv = conv.Reshaped({la.conv_channels(), la.conv_kernel});
  ASSIGN_OR_RETURN(out->a_log, LoadF32(w, backend, p + "A_log", hv));
  ASSIGN_OR_RETURN(out->dt_bias, LoadF32(w, backend, p + "dt_bias", hv));
  ASSIGN_OR_RETURN(out->norm, w.Load(p + "norm.weight", {la.value_head_dim}));
  ASSIGN_OR_RETURN(out->out_proj, w.Load(p + "out_proj.weight", {hidden, la.value_dim()}));
  return Status::Ok();
}

void GatedDeltaNetForward(Backend& backend, const ModelConfig& c, const GatedDeltaNetWeights& w,
                          const TensorView& x, const ForwardBatch& batch, const LinearStateView& state,
                          const TensorView& out) {
  const LinearAttentionConfig& la = c.linear;
  const int64_t tokens = x.dim(0), channels = la.conv_channels(), vd = la.value_dim();
  const int64_t hk = la.num_key_heads, hv = la.num_value_heads, dk = la.key_head_dim, dv = la.value_head_dim;
  const DType act = backend.activation_dtype();

  Tensor proj = backend.Empty(act, {tokens, channels + vd + 2 * hv});  // [T, q|k|v | z | b | a]
  backend.Linear(x, w.in_proj, proj);
  Tensor mixed = backend.Empty(act, {tokens, channels});  // [T, q|k|v] after conv + SiLU
  backend.CausalConv1d(Columns(proj, 0, channels), w.conv, state.conv, batch.state_slots, batch.attention, mixed);

  Tensor core = backend.Empty(act, {tokens, hv, dv});  // [T, Hv, Dv]
  backend.GatedDeltaRule(HeadColumns(mixed, 0, hk, dk), HeadColumns(mixed, hk * dk, hk, dk),
                         HeadColumns(mixed, 2 * hk * dk, hv, dv), Columns(proj, channels + vd + hv, hv),
                         Columns(proj, channels + vd, hv), w.a_log, w.dt_bias, state.recurrent, batch.state_slots,
                         batch.attention, core);
  Tensor normed = backend.Empty(act, {tokens, hv, dv});
  backend.GatedRmsNorm(core, HeadColumns(proj, channels, hv, dv), w.norm, static_cast<float>(c.rms_norm_eps), normed);
  backend.Linear(normed.view().Reshape({tokens, vd}), w.out_proj, out);
}

}  // namespace corolla
