// The CPU backend: float32 activations, weights widened to float32 at load, every op from
// kernels/cpu/ops.h. The correctness oracle for the CUDA backend and the default without a GPU.
#include <cstring>

#include "base/numeric.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/sampling.h"

namespace corolla {
namespace {

// Widens src (bf16/f16/f32, contiguous) into dst (f32).
void WidenInto(const TensorView& src, float* dst) {
  COROLLA_CHECK(src.is_contiguous()) << "weight " << src.ToString() << " is not contiguous";
  int64_t n = src.numel();
  switch (src.dtype) {
    case DType::kF32:
      std::memcpy(dst, src.data, n * sizeof(float));
      break;
    case DType::kBF16: {
      const uint16_t* p = src.ptr<uint16_t>();
      for (int64_t i = 0; i < n; ++i) dst[i] = BitsFloat(static_cast<uint32_t>(p[i]) << 16);
      break;
    }
    case DType::kF16: {
      const fp16* p = src.ptr<fp16>();
      for (int64_t i = 0; i < n; ++i) dst[i] = ToFloat(p[i]);
      break;
    }
    default:
      COROLLA_CHECK(false) << "cannot widen " << src.ToString() << " to f32";
  }
}

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::kCpu; }
  std::string name() const override { return "cpu"; }
  DType activation_dtype() const override { return DType::kF32; }

  Tensor Empty(DType dtype, Shape shape) override { return Tensor::Empty(dtype, shape); }

  Tensor LoadWeight(const TensorView& src) override { return LoadWeightConcat({src}); }

  Tensor LoadWeightConcat(const std::vector<TensorView>& srcs) override {
    COROLLA_CHECK(!srcs.empty());
    Shape shape = srcs[0].shape;
    for (size_t i = 1; i < srcs.size(); ++i) shape.dims[0] += srcs[i].shape[0];
    DType dtype = srcs[0].dtype == DType::kI32 ? DType::kI32 : DType::kF32;
    Tensor t = Tensor::Empty(dtype, shape);
    char* dst = static_cast<char*>(t.view().data);
    for (const auto& src : srcs) {
      if (dtype == DType::kI32) {
        std::memcpy(dst, src.data, src.nbytes());
      } else {
        WidenInto(src, reinterpret_cast<float*>(dst));
      }
      dst += src.numel() * DTypeSize(dtype);
    }
    return t;
  }

  void CopyToHost(const TensorView& src, void* dst) override {
    COROLLA_CHECK(src.is_contiguous());
    std::memcpy(dst, src.data, src.nbytes());
  }
  void CopyFromHost(const void* src, const TensorView& dst) override {
    COROLLA_CHECK(dst.is_contiguous());
    std::memcpy(dst.data, src, dst.nbytes());
  }
  void Synchronize() override {}

  void Embedding(const TensorView& ids, const TensorView& table, const TensorView& out) override {
    cpu::Embedding(ids, table, out);
  }
  void RmsNorm(const TensorView& x, const TensorView& w, float eps, const TensorView& out,
               const TensorView* residual) override {
    cpu::RmsNorm(x, w, eps, out, residual);
  }
  void HeadRmsNorm(const TensorView& x, const TensorView& w, float eps) override {
    cpu::HeadRmsNorm(x, w, eps);
  }
  void Rope(const TensorView& q, const TensorView& k, const TensorView& positions,
            const RopeParams& params) override {
    cpu::Rope(q, k, positions, params);
  }
  void Linear(const TensorView& x, const TensorView& w, const TensorView& out) override {
    cpu::Linear(x, w, out);
  }
  void BatchedLinear(const TensorView& x, const TensorView& w, const TensorView& out) override {
    cpu::BatchedLinear(x, w, out);
  }
  void SiluMul(const TensorView& gate_up, const TensorView& out) override {
    cpu::SiluMul(gate_up, out);
  }
  void GatherRows(const TensorView& x, const TensorView& rows, const TensorView& out) override {
    if (x.dtype == DType::kI32) return cpu::GatherIds(x, rows, out);
    cpu::GatherRows(x, rows, out);
  }
  void Copy(const TensorView& src, const TensorView& dst) override { cpu::Copy(src, dst); }
  void Add(const TensorView& x, const TensorView& y) override { cpu::Add(x, y); }
  void KvWrite(const TensorView& k, const TensorView& v, const KvCacheView& cache,
               const AttentionBatch& batch) override {
    cpu::KvWrite(k, v, cache, batch);
  }
  void Attention(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch,
                 float scale, const TensorView& out) override {
    cpu::Attention(q, cache, batch, scale, out);
  }
  void MoeRoute(const TensorView& router_logits, const MoeRouting& routing,
                const TensorView& topk_ids, const TensorView& topk_weights) override {
    cpu::MoeRoute(router_logits, routing, topk_ids, topk_weights);
  }
  void MoeExperts(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                  const TensorView& w_gate_up, const TensorView& w_down,
                  const TensorView& out) override {
    cpu::MoeExperts(x, topk_ids, topk_weights, w_gate_up, w_down, out);
  }
  bool supports_moe_fp8(int64_t, int64_t) const override { return true; }
  void MoeExpertsFp8(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                     const TensorView& w_gate_up, const TensorView& gu_scale, const TensorView& w_down,
                     const TensorView& d_scale, const TensorView& out) override {
    cpu::MoeExpertsFp8(x, topk_ids, topk_weights, w_gate_up, gu_scale, w_down, d_scale, out);
  }
  bool supports_linear_attention() const override { return true; }
  bool supports_linear_fp8(int64_t, int64_t) const override { return true; }
  void LinearFp8(const TensorView& x, const TensorView& w, const TensorView& w_scale,
                 const TensorView& out) override {
    cpu::LinearFp8(x, w, w_scale, out);
  }
  void SigmoidMul(const TensorView& x, const TensorView& gate) override { cpu::SigmoidMul(x, gate); }
  void CausalConv1d(const TensorView& x, const TensorView& weight, const TensorView& conv_state,
                    const TensorView& state_slots, const AttentionBatch& batch, const TensorView& out) override {
    cpu::CausalConv1d(x, weight, conv_state, state_slots, batch, out);
  }
  void GatedDeltaRule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& a,
                      const TensorView& b, const TensorView& a_log, const TensorView& dt_bias,
                      const TensorView& state, const TensorView& state_slots, const AttentionBatch& batch,
                      const TensorView& out) override {
    cpu::GatedDeltaRule(q, k, v, a, b, a_log, dt_bias, state, state_slots, batch, out);
  }
  void GatedRmsNorm(const TensorView& x, const TensorView& z, const TensorView& w, float eps,
                    const TensorView& out) override {
    cpu::GatedRmsNorm(x, z, w, eps, out);
  }
  void Sample(const TensorView& logits, const SamplingParams* params, const uint64_t* steps,
              int32_t* out_ids) override {
    COROLLA_CHECK(logits.dtype == DType::kF32 && logits.is_contiguous());
    cpu::SampleBatch(logits.ptr<float>(), logits.dim(0), logits.dim(1), params, steps, out_ids);
  }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

Result<std::unique_ptr<Backend>> MakeBackend(const std::string& device) {
  if (device == "cpu") return MakeCpuBackend();
  if (device == "cuda") {
#ifdef COROLLA_HAVE_CUDA
    return MakeCudaBackend(0);
#else
    return Unsupported("--device cuda: this build has no CUDA backend (configure with -DCOROLLA_CUDA=ON)");
#endif
  }
  return InvalidArgument("unknown device '" + device + "' (expected cpu or cuda)");
}

}  // namespace corolla
