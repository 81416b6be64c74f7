#include "kernels/cuda/cuda_backend.h"

#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "base/logging.h"
#include "base/numeric.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe_fp8.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/timeline.h"

namespace corolla {
namespace cuda {

namespace {
// Debugging: COROLLA_CUDA_POISON_EMPTY=1 fills every new tensor with 0xff bytes (NaN in bf16 and
// f32, -1 in integers), so a kernel that reads what nothing wrote shows in the output.
bool PoisonEmpty() {
  static const bool on = [] {
    const char* v = std::getenv("COROLLA_CUDA_POISON_EMPTY");
    return v != nullptr && std::atoi(v) != 0;
  }();
  return on;
}
}  // namespace

Result<std::unique_ptr<Backend>> CudaBackend::Create(int device_idx) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Unsupported(std::string("no CUDA device: ") + cudaGetErrorString(err));
  }
  if (device_idx < 0 || device_idx >= count)
    return InvalidArgument("CUDA device " + std::to_string(device_idx) + " of " + std::to_string(count));
  COROLLA_CUDA_CHECK(cudaSetDevice(device_idx));
  cudaStream_t stream;
  COROLLA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::unique_ptr<Backend>(new CudaBackend(device_idx, stream));
}

CudaBackend::CudaBackend(int device_idx, cudaStream_t stream)
    : device_idx_(device_idx),
      stream_(stream),
      alloc_(std::make_shared<CachingAllocator>(device_idx)),
      linear_(std::make_unique<LtLinear>(*alloc_)),
      fp8_linear_(std::make_unique<Fp8Linear>(*alloc_)),
      host_ids_(std::make_shared<HostIdsPool>()) {}

CudaBackend::~CudaBackend() {
  if (side_stream_ != nullptr) cudaStreamSynchronize(side_stream_);
  cudaStreamSynchronize(stream_);
  if (decode_sync_ != nullptr) cudaFree(decode_sync_);
  linear_.reset();
  fp8_linear_.reset();
  side_linear_.reset();
  side_fp8_linear_.reset();
  if (side_stream_ != nullptr) {
    cudaEventDestroy(fork_event_);
    cudaEventDestroy(join_event_);
    cudaStreamDestroy(side_stream_);
  }
  cudaStreamDestroy(stream_);
}

void CudaBackend::RunOnSideStream(const std::function<void()>& fn) {
  COROLLA_CHECK(!on_side_ && !side_unjoined_) << "RunOnSideStream: the last side work is not joined yet";
  if (side_stream_ == nullptr) {
    COROLLA_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
    COROLLA_CUDA_CHECK(cudaEventCreateWithFlags(&fork_event_, cudaEventDisableTiming));
    COROLLA_CUDA_CHECK(cudaEventCreateWithFlags(&join_event_, cudaEventDisableTiming));
    side_linear_ = std::make_unique<LtLinear>(*alloc_);
    side_fp8_linear_ = std::make_unique<Fp8Linear>(*alloc_);
  }
  // Fork: the side stream starts after everything enqueued so far (in a capture, this makes it
  // part of the capture).
  COROLLA_CUDA_CHECK(cudaEventRecord(fork_event_, stream_));
  COROLLA_CUDA_CHECK(cudaStreamWaitEvent(side_stream_, fork_event_, 0));
  alloc_->DeferFrees(true);
  auto swap = [&] {
    std::swap(stream_, side_stream_);
    std::swap(linear_, side_linear_);
    std::swap(fp8_linear_, side_fp8_linear_);
    on_side_ = !on_side_;
  };
  swap();
  fn();
  swap();
  COROLLA_CUDA_CHECK(cudaEventRecord(join_event_, side_stream_));
  side_unjoined_ = true;
}

void CudaBackend::JoinSideStream() {
  if (!side_unjoined_) return;
  COROLLA_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_event_, 0));
  alloc_->DeferFrees(false);  // any later use of those blocks is ordered after both streams' work
  side_unjoined_ = false;
}

Tensor CudaBackend::Empty(DType dtype, Shape shape) {
  const size_t bytes = static_cast<size_t>(shape.numel() * DTypeSize(dtype));
  void* p = bytes ? alloc_->Allocate(bytes) : nullptr;
  if (p != nullptr && PoisonEmpty()) COROLLA_CUDA_CHECK(cudaMemsetAsync(p, 0xff, bytes, stream_));
  std::shared_ptr<CachingAllocator> alloc = alloc_;
  std::shared_ptr<void> owner(p, [alloc](void* ptr) { alloc->Free(ptr); });
  return Tensor::Adopt(TensorView(p, dtype, shape, Device::kCuda, device_idx_), std::move(owner));
}

Tensor CudaBackend::LoadWeightConcat(const std::vector<TensorView>& srcs) {
  COROLLA_CHECK(!srcs.empty());
  Shape shape = srcs[0].shape;
  for (size_t i = 1; i < srcs.size(); ++i) shape.dims[0] += srcs[i].shape[0];
  const DType dtype = srcs[0].dtype == DType::kI32 ? DType::kI32 : DType::kBF16;
  Tensor t = Empty(dtype, shape);
  char* dst = static_cast<char*>(t.view().data);
  std::vector<std::vector<bf16>> staging;  // converted f32/f16 sources, alive until the sync
  for (const auto& src : srcs) {
    COROLLA_CHECK(src.is_contiguous() && src.device == Device::kCpu) << "weight " << src.ToString();
    const int64_t n = src.numel();
    const void* from = src.data;
    if (dtype == DType::kI32) {
      COROLLA_CHECK(src.dtype == DType::kI32) << "weight " << src.ToString();
    } else if (src.dtype != DType::kBF16) {
      std::vector<bf16>& conv = staging.emplace_back(n);
      if (src.dtype == DType::kF32) {
        for (int64_t i = 0; i < n; ++i) conv[i] = ToBf16(src.ptr<float>()[i]);
      } else {
        COROLLA_CHECK(src.dtype == DType::kF16) << "cannot load " << src.ToString() << " as bf16";
        for (int64_t i = 0; i < n; ++i) conv[i] = ToBf16(ToFloat(src.ptr<fp16>()[i]));
      }
      from = conv.data();
    }
    const size_t bytes = n * DTypeSize(dtype);
    if (bytes) COROLLA_CUDA_CHECK(cudaMemcpyAsync(dst, from, bytes, cudaMemcpyHostToDevice, stream_));
    dst += bytes;
  }
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return t;
}

void CudaBackend::CopyToHost(const TensorView& src, void* dst) {
  COROLLA_CHECK(src.is_contiguous() && src.device == Device::kCuda) << "copy to host " << src.ToString();
  if (src.nbytes() == 0) return;
  COROLLA_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_));
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::CopyFromHost(const void* src, const TensorView& dst) {
  COROLLA_CHECK(dst.is_contiguous() && dst.device == Device::kCuda) << "copy from host " << dst.ToString();
  staging_.CopyToDevice(dst.data, src, dst.nbytes(), stream_);
}

void CudaBackend::Synchronize() { COROLLA_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

Result<Backend::MemoryInfo> CudaBackend::QueryMemory() {
  size_t free_bytes = 0, total_bytes = 0;
  COROLLA_CUDA_CHECK(cudaSetDevice(device_idx_));  // any thread may ask
  COROLLA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return MemoryInfo{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

namespace {

class CudaGraph final : public Backend::Graph {
 public:
  CudaGraph(cudaStream_t stream, cudaGraph_t graph, cudaGraphExec_t exec)
      : stream_(stream), graph_(graph), exec_(exec) {}
  ~CudaGraph() override {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  void Replay() override {
    COROLLA_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
    cuda::TimelineGraphReplayed(exec_, stream_);
  }

 private:
  cudaStream_t stream_;
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
};

}  // namespace

Result<std::unique_ptr<Backend::Graph>> CudaBackend::CaptureGraph(const std::function<void()>& fn) {
  alloc_->SetGraphPool(true);
  fn();  // eager: per-shape caches (GEMM heuristics, rope tables) fill outside the capture
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  // Relaxed: a pool miss may still cudaMalloc (not stream-ordered) while capturing.
  cudaError_t err = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed);
  if (err == cudaSuccess) {
    fn();
    err = cudaStreamEndCapture(stream_, &graph);
  }
  alloc_->SetGraphPool(false);
  if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
  if (err == cudaSuccess) cuda::TimelineGraphCaptured(exec);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    return Internal(std::string("CUDA graph capture: ") + cudaGetErrorString(err));
  }
  return std::unique_ptr<Backend::Graph>(new CudaGraph(stream_, graph, exec));
}

void CudaBackend::Embedding(const TensorView& ids, const TensorView& table, const TensorView& out) {
  cuda::GatherRows(table, ids, out, stream_);
}
void CudaBackend::RmsNorm(const TensorView& x, const TensorView& w, float eps, const TensorView& out,
                          const TensorView* residual) {
  cuda::RmsNorm(x, w, eps, out, residual, stream_);
}
void CudaBackend::HeadRmsNorm(const TensorView& x, const TensorView& w, float eps) {
  cuda::HeadRmsNorm(x, w, eps, stream_);
}
// Frequencies computed on the host exactly as the CPU twin does (YaRN included), uploaded once
// per distinct set, the first time a forward needs them. The upload must be ordered on stream_:
// the table's memory comes from the stream-ordered cache and may still be in use by queued
// kernels of this forward. (A synchronous cudaMemcpy on the legacy stream raced them: with
// --tp 2 the stream lags behind the host on the all-reduces, and the hybrid fixture's first
// attention layer, after three linear ones, read overwritten rotary frequencies.)
const float* CudaBackend::RopeFreqs(const RopeParams& params) {
  const RopeKey key{params.rotary_dim, params.theta, params.interleaved, params.yarn_factor,
                    params.yarn_original_max_positions, params.yarn_beta_fast, params.yarn_beta_slow,
                    params.attention_factor};
  auto it = rope_freqs_.find(key);
  if (it == rope_freqs_.end()) {
    RopeTable table{RopeInvFreq(params), Tensor()};
    table.device = Empty(DType::kF32, {static_cast<int64_t>(table.host.size())});
    it = rope_freqs_.emplace(key, std::move(table)).first;
    const std::vector<float>& host = it->second.host;
    staging_.CopyToDevice(it->second.device.view().data, host.data(), sizeof(float) * host.size(), stream_);
  }
  return it->second.device.ptr<float>();
}
void CudaBackend::Rope(const TensorView& q, const TensorView& k, const TensorView& positions,
                       const RopeParams& params) {
  cuda::Rope(q, k, positions, params, RopeFreqs(params), stream_);
}
void CudaBackend::QkNormRopeKvWrite(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& q_norm_w, const TensorView& k_norm_w, float eps,
                                    const TensorView& positions, const RopeParams& rope, const KvCacheView& cache,
                                    const AttentionBatch& batch) {
  // One launch for the layouts attention_prologue.cu covers, else the four ops.
  if (!cuda::QkNormRopeKvWrite(q, k, v, q_norm_w, k_norm_w, eps, positions, rope, RopeFreqs(rope), cache, batch,
                               stream_))
    Backend::QkNormRopeKvWrite(q, k, v, q_norm_w, k_norm_w, eps, positions, rope, cache, batch);
}
bool CudaBackend::fuses_qk_norm_rope_attention(const AttentionBatch& batch) const {
  return batch.max_q_len == 1 && cuda::FusesDecodePrologue(batch);
}
void CudaBackend::QkNormRopeAttention(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& q_norm_w, const TensorView& k_norm_w, float eps,
                                      const TensorView& positions, const RopeParams& rope, const KvCacheView& cache,
                                      const AttentionBatch& batch, float scale, const TensorView& out) {
  route_hint_.reset();  // (its o_proj is not the next Linear's to know)
  // One launch for decode on the small-batch kernel, else the prologue and the attention.
  if (!cuda::QkNormRopeAttention(q, k, v, q_norm_w, k_norm_w, eps, positions, rope, RopeFreqs(rope), cache, batch,
                                 scale, out, *alloc_, stream_))
    Backend::QkNormRopeAttention(q, k, v, q_norm_w, k_norm_w, eps, positions, rope, cache, batch, scale, out);
}
void CudaBackend::QkNormRopeAttentionProj(const TensorView& q, const TensorView& k, const TensorView& v,
                                          const TensorView& q_norm_w, const TensorView& k_norm_w, float eps,
                                          const TensorView& positions, const RopeParams& rope,
                                          const KvCacheView& cache, const AttentionBatch& batch, float scale,
                                          const TensorView& attn, const TensorView& w_o, const TensorView& out) {
  // One launch for one token where the plan allows; else the attention (one launch or two), then Linear
  // (at one token predicting the MoE's routing, with HintMoeRouting's hint).
  const std::optional<cuda::MoeRouteHint> hint = std::exchange(route_hint_, std::nullopt);
  const cuda::AttentionResult ran = cuda::QkNormRopeAttentionProj(
      q, k, v, q_norm_w, k_norm_w, eps, positions, rope, RopeFreqs(rope), cache, batch, scale, attn, w_o, out, *alloc_,
      stream_);
  if (ran == cuda::AttentionResult::kProjected) return;
  if (ran == cuda::AttentionResult::kNone)
    Backend::QkNormRopeAttention(q, k, v, q_norm_w, k_norm_w, eps, positions, rope, cache, batch, scale, attn);
  const TensorView x = attn.Reshape({attn.dim(0), attn.dim(1) * attn.dim(2)});
  if (hint && cuda::LinearGemv(x, w_o, out, stream_, &*hint)) return;
  Linear(x, w_o, out);
}
void CudaBackend::HintMoeRouting(const TensorView& norm_w, const TensorView& sum, const TensorView& router,
                                 const TensorView& gate_up, const TensorView& down, int top_k) {
  route_hint_.reset();  // (whether to predict is MoePrediction's, gemv.cu: Tuning().moe_predict)
  if (sum.rank() == 2 && sum.dim(0) == 1) route_hint_ = cuda::MoeRouteHint{norm_w, sum, router, top_k, gate_up, down};
}
void CudaBackend::Linear(const TensorView& x, const TensorView& w, const TensorView& out) {
  // A few rows: our weight-streaming GEMV (gemv.cu), a few more its tensor-core form
  // (gemm_skinny.cu); else, or where their layouts rule out, cuBLASLt.
  if (!LinearGemv(x, w, out, stream_) && !LinearSkinny(x, w, out, stream_))
    linear_->Run(x, w, out, stream_);
}
void CudaBackend::LinearFp8(const TensorView& x, const TensorView& w, const TensorView& w_scale,
                            const TensorView& out) {
  // A few rows: the FP8 GEMV with the quantisation fused in (fp8_gemv.cu); else quantise + cuBLASLt.
  if (!LinearFp8Gemv(x, w, w_scale, out, stream_)) fp8_linear_->Run(x, w, w_scale, out, stream_);
}
void CudaBackend::BatchedLinear(const TensorView& x, const TensorView& w, const TensorView& out) {
  if (linear_->RunBatched(x, w, out, stream_)) return;
  static bool warned = false;  // once: a slow path, not an error
  if (!warned) {
    warned = true;
    LOG(WARNING) << "BatchedLinear: cuBLASLt has no batched algorithm for x " << x.ToString() << " w " << w.ToString()
                 << " out " << out.ToString() << "; running one Linear per batch";
  }
  for (int64_t b = 0; b < x.dim(1); ++b) {  // [T, K] and [T, N] views of batch b
    TensorView xb = x, ob = out;
    xb.data = static_cast<char*>(x.data) + b * x.strides[1] * DTypeSize(x.dtype);
    xb.shape = {x.dim(0), x.dim(2)};
    xb.strides = {x.strides[0], 1, 0, 0};
    ob.data = static_cast<char*>(out.data) + b * out.strides[1] * DTypeSize(out.dtype);
    ob.shape = {out.dim(0), out.dim(2)};
    ob.strides = {out.strides[0], 1, 0, 0};
    Linear(xb, w.Index(b), ob);
  }
}
void CudaBackend::SiluMul(const TensorView& gate_up, const TensorView& out) {
  cuda::SiluMul(gate_up, out, stream_);
}
void CudaBackend::GatherRows(const TensorView& x, const TensorView& rows, const TensorView& out) {
  if (x.dtype == DType::kI32) return cuda::GatherIds(x, rows, out, stream_);
  cuda::GatherRows(x, rows, out, stream_);
}
void CudaBackend::Copy(const TensorView& src, const TensorView& dst) { cuda::Copy(src, dst, stream_); }
void CudaBackend::Add(const TensorView& x, const TensorView& y) { cuda::Add(x, y, stream_); }
void CudaBackend::KvWrite(const TensorView& k, const TensorView& v, const KvCacheView& cache,
                          const AttentionBatch& batch) {
  cuda::KvWrite(k, v, cache, batch, stream_);
}
void CudaBackend::Attention(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch,
                            float scale, const TensorView& out) {
  cuda::Attention(q, cache, batch, scale, out, *alloc_, stream_);
}
void CudaBackend::MoeRoute(const TensorView& router_logits, const MoeRouting& routing,
                           const TensorView& topk_ids, const TensorView& topk_weights) {
  cuda::MoeRoute(router_logits, routing, topk_ids, topk_weights, stream_);
}
void CudaBackend::MoeRouter(const TensorView& x, const TensorView& w_router, const MoeRouting& routing,
                            const TensorView& topk_ids, const TensorView& topk_weights) {
  // A few tokens: one launch (router.cu); else the router GEMM and MoeRoute.
  if (!cuda::MoeRouter(x, w_router, routing, topk_ids, topk_weights, stream_))
    Backend::MoeRouter(x, w_router, routing, topk_ids, topk_weights);
}
void CudaBackend::RmsNormLinear(const TensorView& y, const TensorView& norm_w, float eps, const TensorView& sum,
                                const TensorView& x, const TensorView& w, const TensorView& out) {
  if (!cuda::RmsNormLinear(y, norm_w, eps, sum, x, w, out, stream_)) Backend::RmsNormLinear(y, norm_w, eps, sum, x, w, out);
}
bool CudaBackend::folds_moe_residual(int64_t tokens) const { return cuda::Tuning().moe_residual_fold && tokens == 1; }
void CudaBackend::MoeExpertsResidual(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                                     const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out,
                                     const TensorView& sum) {
  if (!cuda::MoeExpertsResidual(x, topk_ids, topk_weights, w_gate_up, w_down, out, sum, *alloc_, stream_))
    Backend::MoeExpertsResidual(x, topk_ids, topk_weights, w_gate_up, w_down, out, sum);
}
void CudaBackend::NormLinear(const TensorView& norm_w, float eps, const TensorView& sum, const TensorView& x,
                             const TensorView& w, const TensorView& out) {
  // (The layer's routing hint, kept for its o_proj, may have the qkv projection prefetch experts.)
  if (!cuda::NormLinear(norm_w, eps, sum, x, w, out, stream_, route_hint_ ? &*route_hint_ : nullptr))
    Backend::NormLinear(norm_w, eps, sum, x, w, out);
}
void CudaBackend::RmsNormMoeRouter(const TensorView& y, const TensorView& norm_w, float eps, const TensorView& sum,
                                   const TensorView& x, const TensorView& w_router, const MoeRouting& routing,
                                   const TensorView& topk_ids, const TensorView& topk_weights) {
  if (!cuda::RmsNormMoeRouter(y, norm_w, eps, sum, x, w_router, routing, topk_ids, topk_weights, stream_))
    Backend::RmsNormMoeRouter(y, norm_w, eps, sum, x, w_router, routing, topk_ids, topk_weights);
}
void CudaBackend::MoeExperts(const TensorView& x, const TensorView& topk_ids,
                             const TensorView& topk_weights, const TensorView& w_gate_up,
                             const TensorView& w_down, const TensorView& out) {
  cuda::MoeExperts(x, topk_ids, topk_weights, w_gate_up, w_down, out, *alloc_, stream_, prompt_step_);
}
void CudaBackend::PlanStep(const AttentionBatch& batch, int64_t tokens) {
  prompt_step_ = batch.max_q_len > 1 && 2 * int64_t{batch.max_q_len} >= tokens;
}
bool CudaBackend::supports_moe_fp8(int64_t hidden, int64_t inter) const {
  return cuda::MoeFp8Supports(hidden, inter);
}
void CudaBackend::MoeExpertsFp8(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                                const TensorView& w_gate_up, const TensorView& gu_scale, const TensorView& w_down,
                                const TensorView& d_scale, const TensorView& out) {
  cuda::MoeExpertsFp8(x, topk_ids, topk_weights, w_gate_up, gu_scale, w_down, d_scale, out, *alloc_, stream_);
}
bool CudaBackend::DecodeMoeStack(const MoeDecoderStack& stack, const AttentionBatch& batch,
                                 const TensorView& positions, const TensorView& sum, const TensorView& x) {
  if (!Tuning().decode_stack) return false;
  if (decode_sync_ == nullptr) {  // first use: eager (CaptureGraph warms up before it records)
    const size_t bytes = static_cast<size_t>(cuda::DecodeStackSyncWords()) * sizeof(unsigned);
    COROLLA_CUDA_CHECK(cudaMalloc(&decode_sync_, bytes));
    COROLLA_CUDA_CHECK(cudaMemsetAsync(decode_sync_, 0, bytes, stream_));
  }
  return cuda::DecodeMoeStack(stack, batch, positions, sum, x, RopeFreqs(stack.rope), decode_sync_, *alloc_,
                              stream_);
}
void CudaBackend::SigmoidMul(const TensorView& x, const TensorView& gate) { cuda::SigmoidMul(x, gate, stream_); }
void CudaBackend::CausalConv1d(const TensorView& x, const TensorView& weight, const TensorView& conv_state,
                               const TensorView& state_slots, const AttentionBatch& batch, const TensorView& out) {
  cuda::CausalConv1d(x, weight, conv_state, state_slots, batch, out, stream_);
}
void CudaBackend::GatedDeltaRule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& a,
                                 const TensorView& b, const TensorView& a_log, const TensorView& dt_bias,
                                 const TensorView& state, const TensorView& state_slots, const AttentionBatch& batch,
                                 const TensorView& out) {
  cuda::GatedDeltaRule(q, k, v, a, b, a_log, dt_bias, state, state_slots, batch, out, stream_);
}
void CudaBackend::GatedRmsNorm(const TensorView& x, const TensorView& z, const TensorView& w, float eps,
                               const TensorView& out) {
  cuda::GatedRmsNorm(x, z, w, eps, out, stream_);
}
void CudaBackend::Sample(const TensorView& logits, const SamplingParams* params, const uint64_t* steps,
                         int32_t* out_ids) {
  cuda::Sample(logits, params, steps, out_ids, *alloc_, stream_);
}
std::unique_ptr<Backend::PendingIds> CudaBackend::SampleAsync(const TensorView& logits, const SamplingParams* params,
                                                              const uint64_t* steps, const TensorView& ids) {
  return cuda::SampleAsync(logits, params, steps, ids, *alloc_, staging_, host_ids_, stream_);
}

}  // namespace cuda

Result<std::unique_ptr<Backend>> MakeCudaBackend(int device_idx) {
  return cuda::CudaBackend::Create(device_idx);
}

}  // namespace corolla
