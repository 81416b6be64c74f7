// The host-visible surface of the CUDA kernels: one launcher per Backend op. Each launcher
// validates its tensors in one line, then enqueues on `stream` without synchronising.
// Activations and the KV cache are bf16 (router logits / weights f32, ids i32) unless stated.
// Launchers are thread-compatible: callers serialise use of a stream.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "kernels/backend.h"
#include "kernels/cuda/allocator.h"
#include "kernels/cuda/pinned_host.h"
#include "kernels/cuda/tuning.h"

namespace corolla::cuda {

// Scratch device memory for the duration of one op; returned to the allocator at scope end
// (stream order makes the reuse safe).
class ScratchBuffer {
 public:
  ScratchBuffer(CachingAllocator& alloc, size_t bytes)
      : alloc_(alloc), ptr_(bytes ? alloc.Allocate(bytes) : nullptr) {}
  ~ScratchBuffer() { alloc_.Free(ptr_); }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  CachingAllocator& alloc_;
  void* ptr_;
};

// gemv.cu: Linear (semantics: kernels/backend.h) for x of 1..Tuning().linear_gemv_max_rows
// rows; false (nothing launched) for more rows or layouts it does not cover. Launched with
// programmatic dependent launch: it reads w before the previous kernel has finished (w must be
// a weight, which nothing writes during a forward).
// With `hint` (Backend::HintMoeRouting's, the layer's o_proj at one row; Tuning().moe_predict
// with moe_prefetch_previous) the staged GEMV's first CTAs also predict the layer's MoE routing
// before their dependency wait, for the batch-1 MoE's L2 prefetch (moe_decode.h); it changes
// no result.
struct MoeRouteHint {
  TensorView norm_w, sum, router;  // [H] bf16 or f32, [1, H] bf16, [E, H] bf16
  int top_k = 0;
  TensorView gate_up{}, down{};  // the experts' [E, 2I, H] and [E, H, I] (Tuning().moe_prefetch_qkv)
};
bool LinearGemv(const TensorView& x, const TensorView& w, const TensorView& out, cudaStream_t s,
                const MoeRouteHint* hint = nullptr);
// gemm_skinny.cu: Linear for x of Tuning().linear_gemv_max_rows + 1 .. Tuning().linear_mma_max_rows
// (<= 16) rows on the tensor cores, as a weight stream; false (nothing launched) for other row
// counts or layouts it does not cover. Launched with programmatic dependent launch, as LinearGemv.
bool LinearSkinny(const TensorView& x, const TensorView& w, const TensorView& out, cudaStream_t s);
int64_t LinearSkinnyLaunches();  // tests: LinearSkinny's launches so far
// Where the last decode attention on stream s folded its prologue in (QkNormRopeAttention and
// QkNormRopeAttentionProj set it), the staged GEMV launches there at Tuning().gemv_staged_carveout_folded, so that the
// attention's CTAs fit beside the qkv GEMV's; else at gemv_staged_carveout. Every layer of a step
// plans alike: only a step's first GEMV follows the step before.
void SetStagedGemvBesideFoldedAttention(cudaStream_t s, bool folded);
int64_t StagedGemvBesideLaunches();  // tests: launches of the staged GEMV beside a folded attention
// gemv.cu: Backend::RmsNormLinear of one row in one launch (the staged GEMV with the norm folded
// in) when Tuning().gemv_staged_norm is on and the shapes fit; false (nothing launched) otherwise.
bool RmsNormLinear(const TensorView& y, const TensorView& norm_w, float eps, const TensorView& sum, const TensorView& x,
                   const TensorView& w, const TensorView& out, cudaStream_t s);
// gemv.cu: Backend::NormLinear of one row in one launch (the staged GEMV normalising sum as it
// stages x; CTA 0 writes x) where the shapes fit; false (nothing launched) otherwise. With `hint`
// (the layer's Backend::HintMoeRouting, Tuning().moe_prefetch_qkv) its CTAs prefetch expert rows
// into L2 as they leave.
bool NormLinear(const TensorView& norm_w, float eps, const TensorView& sum, const TensorView& x, const TensorView& w,
                const TensorView& out, cudaStream_t s, const MoeRouteHint* hint = nullptr);

// elementwise.cu
void GatherRows(const TensorView& x, const TensorView& rows, const TensorView& out, cudaStream_t s);
void RmsNorm(const TensorView& x, const TensorView& w, float eps, const TensorView& out,
             const TensorView* residual, cudaStream_t s);
void HeadRmsNorm(const TensorView& x, const TensorView& w, float eps, cudaStream_t s);
// inv_freq: device [rotary_dim / 2], RopeInvFreq(params) (the backend caches it per params).
void Rope(const TensorView& q, const TensorView& k, const TensorView& positions,
          const RopeParams& params, const float* inv_freq, cudaStream_t s);
void Copy(const TensorView& src, const TensorView& dst, cudaStream_t s);
void SiluMul(const TensorView& gate_up, const TensorView& out, cudaStream_t s);
void Add(const TensorView& x, const TensorView& y, cudaStream_t s);
void KvWrite(const TensorView& k, const TensorView& v, const KvCacheView& cache,
             const AttentionBatch& batch, cudaStream_t s);

// linear_attention.cu: Gated DeltaNet and the sigmoid gates (semantics: kernels/backend.h).
void SigmoidMul(const TensorView& x, const TensorView& gate, cudaStream_t s);
void CausalConv1d(const TensorView& x, const TensorView& weight, const TensorView& conv_state,
                  const TensorView& state_slots, const AttentionBatch& batch, const TensorView& out,
                  cudaStream_t s);
void GatedDeltaRule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& a,
                    const TensorView& b, const TensorView& a_log, const TensorView& dt_bias,
                    const TensorView& state, const TensorView& state_slots, const AttentionBatch& batch,
                    const TensorView& out, cudaStream_t s);
void GatedRmsNorm(const TensorView& x, const TensorView& z, const TensorView& w, float eps, const TensorView& out,
                  cudaStream_t s);

// attention_prologue.cu: Backend::QkNormRopeKvWrite in one launch when the layout is covered
// (whole-head neox rotary, D 64/128/256, separate K/V caches); false (nothing launched) otherwise.
// inv_freq: device [D / 2], RopeInvFreq(rope).
bool QkNormRopeKvWrite(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& q_norm_w,
                       const TensorView& k_norm_w, float eps, const TensorView& positions, const RopeParams& rope,
                       const float* inv_freq, const KvCacheView& cache, const AttentionBatch& batch, cudaStream_t s);

// Whether attention_prologue.cu's kernel covers this prologue (its shapes, dtypes, alignment).
bool QkNormRopeKvWriteServes(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& q_norm_w,
                             const TensorView& k_norm_w, const TensorView& positions, const RopeParams& rope,
                             const KvCacheView& cache, const AttentionBatch& batch);

// attention.cu
void Attention(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch,
               float scale, const TensorView& out, CachingAllocator& alloc, cudaStream_t s);
// Whether decode attention (every sequence one query token) folds its prologue in for this
// batch: Tuning().attention_fused_prologue, or at most attention_fused_prologue_max_seqs (2)
// sequences of max_seq_len at least attention_fused_prologue_min_keys.
bool FusesDecodePrologue(const AttentionBatch& batch);
// attention_decode.cu: whether a decode batch merges its splits as one cluster with at most a
// cluster's 16 of them (Tuning().attention_decode_cluster_merge_seqs and _cluster_max_keys);
// such a batch keeps its prologue apart.
bool DecodeSplitsCappedToCluster(const AttentionBatch& batch);
// Backend::QkNormRopeAttention in one launch: the prologue folded into the small-batch decode
// attention (attention_decode.cu) where FusesDecodePrologue, the decode kernel serves the shapes
// and QkNormRopeKvWriteServes; false (nothing launched) otherwise. inv_freq: device [D / 2],
// RopeInvFreq(rope).
bool QkNormRopeAttention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& q_norm_w,
                         const TensorView& k_norm_w, float eps, const TensorView& positions, const RopeParams& rope,
                         const float* inv_freq, const KvCacheView& cache, const AttentionBatch& batch, float scale,
                         const TensorView& out, CachingAllocator& alloc, cudaStream_t s);

// What a fused attention call launched: nothing, the attention (with its prologue), or the
// attention with the o projection folded in too.
enum class AttentionResult { kNone, kAttention, kProjected };
// Backend::QkNormRopeAttentionProj: with Tuning().attention_region, where the plan allows (one
// token, group <= 8, every CTA resident at once), the prologue, the attention and the o projection
// (w_o [N, Hq D], proj_out [1, N], bf16) in one launch: kProjected. Else QkNormRopeAttention:
// kAttention when it launched (proj_out not written), kNone when nothing was launched.
AttentionResult QkNormRopeAttentionProj(const TensorView& q, const TensorView& k, const TensorView& v,
                                        const TensorView& q_norm_w, const TensorView& k_norm_w, float eps,
                                        const TensorView& positions, const RopeParams& rope, const float* inv_freq,
                                        const KvCacheView& cache, const AttentionBatch& batch, float scale,
                                        const TensorView& out, const TensorView& w_o, const TensorView& proj_out,
                                        CachingAllocator& alloc, cudaStream_t s);

// attention_decode.cu: how many decode launches so far ran the cluster merge
// (Tuning().attention_decode_cluster_merge_seqs), so tests can tell it from the fallback.
int64_t AttentionDecodeClusterLaunches();
// attention_decode.cu: how many cluster launches so far planned fewer splits than the plan's so
// that their clusters fit the device at once (Tuning().attention_decode_one_wave).
int64_t AttentionDecodeClusterCuts();
// attention_decode.cu: how many decode launches so far merged their splits wide (WideMergeDecode).
int64_t AttentionDecodeWideMergeLaunches();
// attention_decode.cu: how many launches so far folded the o projection in (QkNormRopeAttentionProj).
int64_t AttentionRegionLaunches();

// attention_wgmma.cu (called by Attention): the prefill kernel for Dk = 128 or 192 (DeepSeek's
// decompressed MLA) and Dv = 128 on wgmma, separate K/V caches, 16-byte aligned q/out rows
// (Attention checks all of it); one CTA per 128 query rows of a (sequence, KV head), no
// split-KV; K/V tiles by TMA where Dk is 128 and Tuning().attention_wgmma_tma and the cache
// allow, else by cp.async. Supported: the device is
// sm_90 with the shared memory it needs.
bool AttentionWgmmaSupported();
// Builds of the wgmma prefill kernel: Tuning().attention_wgmma_variant 0 .. this - 1.
inline constexpr int kAttentionWgmmaVariants = 6;
void AttentionWgmma(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch, float scale_log2,
                    const TensorView& out, cudaStream_t s);
// One S = q k^T tile (q [64, 128], k [128, 128] bf16 -> s_out [64, 128] f32) and one O = p v tile
// (p [64, 128 keys], v [128 keys, 128] bf16 -> o_out [64, 128] f32) through the kernel's
// wrappers and shared layouts; wide: P V as m64n128k16 (the kernel's choice) else 2 x m64n64k16.
// CudaKernelTest.AttentionWgmmaTileProbe.
void AttentionWgmmaTileProbe(const TensorView& q, const TensorView& k, const TensorView& p, const TensorView& v,
                             const TensorView& s_out, const TensorView& o_out, bool wide, cudaStream_t s);

// mla_decode.cu: Attention (semantics: kernels/backend.h) on tensor cores for MLA's absorbed
// decode: one token per sequence (max_q_len 1), one latent KV head shared by K and V (Dk/Dv
// 576/512, or the test fixture's 48/32), 16-byte aligned q rows. MlaDecodeServes says whether a
// call is such (and Tuning().attention_mma is on); Attention routes those to MlaDecode.
bool MlaDecodeServes(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch,
                     const TensorView& out);
void MlaDecode(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch, float scale,
               const TensorView& out, CachingAllocator& alloc, cudaStream_t s);

// moe.cu
void MoeRoute(const TensorView& router_logits, const MoeRouting& routing,
              const TensorView& topk_ids, const TensorView& topk_weights, cudaStream_t s);
// prompt: the tokens are mostly one prompt's (CudaBackend::PlanStep), whose routing is uneven;
// the grouped GEMMs then take larger tiles from fewer rows an expert (GroupedGemmTileRows).
void MoeExperts(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out,
                CachingAllocator& alloc, cudaStream_t s, bool prompt = false);
// Backend::MoeExpertsResidual where the few-token pair path with the slot-wise down kernel takes
// the batch (Tuning().moe_residual_fold): its CTAs also add their output rows into sum (RmsNorm's
// rounding); false (nothing launched) otherwise.
bool MoeExpertsResidual(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                        const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out,
                        const TensorView& sum, CachingAllocator& alloc, cudaStream_t s);

// moe.cu: out[t] = sum_k topk_weights[t, k] * y[slot_row[t * K + k]] (rows < 0 skipped), f32
// sums rounded to bf16 once; y [rows, H] f32 or bf16 (y_dtype), out [T, H] bf16. The last step of
// MoeExperts and MoeExpertsFp8's grouped paths.
void MoeCombine(const void* y, DType y_dtype, const int32_t* slot_row,
                const TensorView& topk_weights, const TensorView& out, cudaStream_t s);

// router.cu: Backend::RmsNormMoeRouter in one launch where the shapes fit: the cluster
// norm-router (router_norm.cu) of up to Tuning().cluster_norm_router_max_tokens tokens when
// Tuning().cluster_norm_router is set, else the staged router with the norm folded in (one
// token) when Tuning().staged_router_norm is on; false (nothing launched) otherwise.
bool RmsNormMoeRouter(const TensorView& y, const TensorView& norm_w, float eps, const TensorView& sum,
                      const TensorView& x, const TensorView& w_router, const MoeRouting& routing,
                      const TensorView& topk_ids, const TensorView& topk_weights, cudaStream_t s);
// router_norm.cu: how many cluster norm-router launches so far held their rows in registers
// (Tuning().cluster_norm_router_regs), so tests can tell that build from the shared-memory one.
int64_t ClusterNormRouterRegLaunches();
// router.cu: Backend::MoeRouter (router GEMV + MoeRoute) in one launch for x of at most
// min(8, Tuning().fused_router_max_tokens) rows; false (nothing launched) for more rows or
// layouts it does not cover (E not a multiple of 16, H not of 8, unaligned rows).
bool MoeRouter(const TensorView& x, const TensorView& w, const MoeRouting& routing, const TensorView& topk_ids,
               const TensorView& topk_weights, cudaStream_t s);

// decode_stack.cu: Backend::DecodeMoeStack in one persistent launch (one CTA per SM) for the
// shapes it covers (head dim 128, GQA group <= 16, H and Hq * D <= 8192, top_k * I <= 6144, E <=
// 512, softmax routing, whole-head neox RoPE, at most kMaxStackLayers layers, one sequence);
// false (nothing launched) otherwise or when Tuning().decode_stack is off. inv_freq: device
// [D / 2], RopeInvFreq(stack.rope). sync: DecodeStackSyncWords() zeroed words, owned by the
// stream (the kernel leaves them zero again).
constexpr int kMaxStackLayers = 96;
int DecodeStackSyncWords();
bool DecodeMoeStack(const MoeDecoderStack& stack, const AttentionBatch& batch, const TensorView& positions,
                    const TensorView& sum, const TensorView& x_out, const float* inv_freq, unsigned* sync,
                    CachingAllocator& alloc, cudaStream_t s);

// sampling.cu: one token per row of logits [B, V] (f32 or bf16, contiguous) into out_ids (host).
// Synchronises the stream (the ids are needed on the host).
void Sample(const TensorView& logits, const SamplingParams* params, const uint64_t* steps,
            int32_t* out_ids, CachingAllocator& alloc, cudaStream_t s);
// Sample's ids into `ids` (device [B] i32), then on to a pinned slot of `pool`, without
// synchronising (the row parameters go up through `staging`); the result waits for them.
std::unique_ptr<Backend::PendingIds> SampleAsync(const TensorView& logits, const SamplingParams* params,
                                                 const uint64_t* steps, const TensorView& ids,
                                                 CachingAllocator& alloc, HostStaging& staging,
                                                 const std::shared_ptr<HostIdsPool>& pool, cudaStream_t s);
// GatherRows for token ids: x [T, 1] i32, rows [N] i32, out [N, 1] i32; an invalid row gives -1.
void GatherIds(const TensorView& x, const TensorView& rows, const TensorView& out, cudaStream_t s);

}  // namespace corolla::cuda
