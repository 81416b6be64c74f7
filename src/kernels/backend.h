// Backend: every operation a model forward needs, on one device. Model code calls these with
// TensorViews and never includes a device header; the backend (cpu or cuda) is chosen at load.
// Shapes in comments: T tokens in the flat batch, B sequences, H hidden size, D head dim,
// Hq/Hk query/KV heads, E experts, K experts per token, V vocabulary.
// A Backend is used by one thread at a time (the engine's step thread).
#pragma once

#include <unistd.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "kernels/sampling.h"
#include "tensor/tensor.h"

namespace corolla {

// Paged KV cache of one attention layer. Within a block the layout is heads-major:
// k, v: [num_blocks, Hk, block_size, D], so a block splits or joins by head.
struct KvCacheView {
  TensorView k;
  TensorView v;
  int block_size() const { return static_cast<int>(k.dim(2)); }
};

// Metadata of one flat batch of B sequences, each contributing q_len new tokens (prefill chunk
// or one decode token) after a cached prefix. Tokens of sequence b are rows
// [query_start[b], query_start[b+1]) of the flat batch; they sit at positions
// seq_lens[b] - q_len .. seq_lens[b] - 1, and attend causally to all earlier positions.
struct AttentionBatch {
  TensorView query_start;   // [B + 1] i32, first element 0
  TensorView seq_lens;      // [B] i32, context length including this step's tokens
  TensorView block_tables;  // [B, max_blocks_per_seq] i32, physical block of each logical block
  TensorView slot_mapping;  // [T] i32, cache slot (block * block_size + offset) of each token
  int max_q_len = 0;        // host-side hints for kernel planning
  int max_seq_len = 0;
  // Host-side hint: the first num_decode_seqs sequences have one query token each (0: unknown).
  // A step that decodes some sequences and prefills others can give those rows to a decode
  // kernel instead of a prompt kernel's tiles.
  int num_decode_seqs = 0;
};

struct RopeParams {
  int rotary_dim = 0;  // leading dims of each head that rotate (partial rotary); the rest pass through
  float theta = 10000.0f;
  // false: neox style, pairs (i, i + rotary_dim/2), as Qwen does. true: adjacent pairs
  // (2i, 2i+1), as DeepSeek's rope_interleave (which reorders the outputs; a dot product of two
  // vectors rotated alike does not see the order, so the pairs stay in place here).
  bool interleaved = false;
  // YaRN (yarn_factor > 1): frequencies blended between interpolated and extrapolated by a ramp.
  float yarn_factor = 1.0f;
  int yarn_original_max_positions = 0;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  float attention_factor = 1.0f;  // multiplies cos and sin
};

// The rotary inverse frequencies [rotary_dim / 2] of `params`, as transformers computes them.
std::vector<float> RopeInvFreq(const RopeParams& params);

struct MoeRouting {
  int top_k = 0;
  bool renormalize = true;  // divide the top-k weights by their sum
  // "softmax" (Qwen): weights from the softmax of the logits. "sigmoid" (DeepSeek): sigmoid
  // scores; selection adds correction_bias and is limited to the topk_groups best of num_groups
  // groups (a group's score: the sum of its two best); weights are the unbiased scores.
  bool sigmoid = false;
  int num_groups = 1;
  int topk_groups = 1;
  float scaling_factor = 1.0f;  // multiplies the final weights (routed_scaling_factor)
  TensorView correction_bias{};  // [E] f32, or empty
};

// One decoder layer of a Qwen3-MoE model as Backend::DecodeMoeStack takes it: attention with
// q/k RMSNorm (no output gate) and routed experts (no shared expert), weights as Qwen3's loader
// holds them (qkv rows q | k | v; gate_up [E, 2I, H], gate rows first; down [E, H, I]).
struct MoeDecoderLayer {
  TensorView input_norm, qkv, q_norm, k_norm, o, post_attention_norm;  // norms [H] / [D]
  TensorView router, gate_up, down;
  KvCacheView cache;
};
struct MoeDecoderStack {
  std::vector<MoeDecoderLayer> layers;
  TensorView final_norm;  // [H]
  int num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  float eps = 1e-6f;           // of every RMSNorm
  float attention_scale = 1.0f;
  RopeParams rope;
  MoeRouting routing;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // dtype of activations and of the KV cache: f32 on the CPU, bf16 on CUDA.
  virtual DType activation_dtype() const = 0;

  // --- memory ---------------------------------------------------------------------------
  virtual Tensor Empty(DType dtype, Shape shape) = 0;
  // A weight in the backend's storage format (the CPU widens bf16/f16 to f32) from host memory
  // (typically an mmapped checkpoint). `rows` of src concatenated along dim 0 when several.
  virtual Tensor LoadWeight(const TensorView& host_src) = 0;
  virtual Tensor LoadWeightConcat(const std::vector<TensorView>& host_srcs) = 0;
  virtual void CopyToHost(const TensorView& src, void* dst) = 0;
  virtual void CopyFromHost(const void* src, const TensorView& dst) = 0;
  virtual void Synchronize() = 0;
  // Free and total bytes of the device's memory, for sizing the KV cache as a fraction of it
  // (--gpu-memory-utilization). The default answers for the CPU (host RAM: free excludes the
  // page cache); a device backend overrides it (CUDA: cudaMemGetInfo), else it is Unsupported.
  // Unlike the rest, callable from any thread while the backend works (load progress polls it).
  struct MemoryInfo {
    int64_t free_bytes = 0;
    int64_t total_bytes = 0;
  };
  virtual Result<MemoryInfo> QueryMemory() {
    if (device() != Device::kCpu) return Unsupported(name() + " does not report its free memory yet");
    const int64_t page = sysconf(_SC_PAGE_SIZE);
    return MemoryInfo{sysconf(_SC_AVPHYS_PAGES) * page, sysconf(_SC_PHYS_PAGES) * page};
  }

  // --- ops ------------------------------------------------------------------------------
  // out[t] = table[ids[t]]. ids [T] i32, table [V, H], out [T, H].
  virtual void Embedding(const TensorView& ids, const TensorView& table, const TensorView& out) = 0;
  // With residual: residual += x, then out = rmsnorm(residual) * w. Without: out = rmsnorm(x) * w.
  // x, out, residual [T, H]; w [H]. out may alias x.
  virtual void RmsNorm(const TensorView& x, const TensorView& w, float eps, const TensorView& out,
                       const TensorView* residual) = 0;
  // Per-head RMSNorm in place: x [T, heads, D] (rows may be strided), w [D].
  virtual void HeadRmsNorm(const TensorView& x, const TensorView& w, float eps) = 0;
  // Rotary embedding in place on q [T, Hq, D] and k [T, Hk, D] at positions [T] i32.
  virtual void Rope(const TensorView& q, const TensorView& k, const TensorView& positions,
                    const RopeParams& params) = 0;
  // out = x @ w^T. x [T, K], w [N, K], out [T, N]. w is a weight: nothing writes it during a
  // forward (CUDA may start streaming it before the previous kernel has finished).
  virtual void Linear(const TensorView& x, const TensorView& w, const TensorView& out) = 0;
  // out = silu(gate) * up, gate_up [T, 2I] (gate first), out [T, I].
  virtual void SiluMul(const TensorView& gate_up, const TensorView& out) = 0;
  // out[i] = x[rows[i]]. x [T, H], rows [N] i32, out [N, H]; x and out of the activation
  // dtype, or i32 (token ids, as [T, 1]: the engine gathers a step's input ids on the device).
  virtual void GatherRows(const TensorView& x, const TensorView& rows, const TensorView& out) = 0;
  // dst = src, same shape (rank <= 3), any strides with a contiguous innermost dimension.
  virtual void Copy(const TensorView& src, const TensorView& dst) = 0;
  // x += y, both [T, H].
  virtual void Add(const TensorView& x, const TensorView& y) = 0;
  // Writes k [T, Hk, Dk] and v [T, Hk, Dv] into the cache at batch.slot_mapping. When
  // cache.k and cache.v are one tensor (MLA's latent), k and v are the same rows.
  virtual void KvWrite(const TensorView& k, const TensorView& v, const KvCacheView& cache,
                       const AttentionBatch& batch) = 0;
  // Causal GQA attention of q [T, Hq, Dk] over the paged cache (which already holds this
  // step's k/v). out [T, Hq, Dv]; Dv <= Dk (MLA reads the first Dv dims of its latent as V).
  virtual void Attention(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch,
                         float scale, const TensorView& out) = 0;
  // Router: softmax over router_logits [T, E] in f32, top-k, optional renormalisation.
  // topk_ids [T, K] i32, topk_weights [T, K] f32.
  virtual void MoeRoute(const TensorView& router_logits, const MoeRouting& routing,
                        const TensorView& topk_ids, const TensorView& topk_weights) = 0;
  // out[t] = sum_k w[t,k] * down_e(silu(gate_e x) * up_e x), e = topk_ids[t,k].
  // x [T, H], w_gate_up [E, 2I, H] (gate rows first), w_down [E, H, I], out [T, H].
  // Ids outside [0, E) are skipped: under expert parallelism w holds this rank's experts only.
  virtual void MoeExperts(const TensorView& x, const TensorView& topk_ids,
                          const TensorView& topk_weights, const TensorView& w_gate_up,
                          const TensorView& w_down, const TensorView& out) = 0;
  // --- Gated DeltaNet (Qwen3.5 / Qwen3-Next hybrids) and gated attention -----------------
  // Backends without these return false here (models check at load) and abort if called.
  virtual bool supports_linear_attention() const { return false; }
  // x [T, N] *= sigmoid(gate [T, G]), each gate column covering N / G consecutive columns.
  virtual void SigmoidMul(const TensorView& x, const TensorView& gate);
  // Causal depthwise conv1d (kernel K) + SiLU over each sequence's chunk, continuing from its
  // conv state (the K-1 inputs before the chunk; zeros where the sequence starts at position 0)
  // and leaving the last K-1 inputs there. x, out [T, C]; weight [C, K];
  // conv_state [slots, C, K-1]; state_slots [B] i32.
  virtual void CausalConv1d(const TensorView& x, const TensorView& weight, const TensorView& conv_state,
                            const TensorView& state_slots, const AttentionBatch& batch,
                            const TensorView& out);
  // The gated delta rule over each sequence's chunk, from and back into its recurrent state
  // (zeros at position 0): q, k L2-normalised (q also scaled by Dk^-0.5); per value head h,
  // with g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b):
  //   S = exp(g) S;  S += k (beta (v - S^T k))^T;  out = S^T q.
  // q, k [T, Hk, Dk] (value head h reads q/k head h / (Hv/Hk)); v [T, Hv, Dv]; a, b [T, Hv];
  // A_log, dt_bias [Hv] f32; state [slots, Hv, Dk, Dv] f32 or bf16; out [T, Hv, Dv]. The math is
  // f32; a bf16 state is widened at the start of each sequence's chunk and rounded (nearest
  // even) when written back at its end.
  virtual void GatedDeltaRule(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& a, const TensorView& b, const TensorView& a_log,
                              const TensorView& dt_bias, const TensorView& state,
                              const TensorView& state_slots, const AttentionBatch& batch,
                              const TensorView& out);
  // out = w * rmsnorm(x) * silu(z) per head: x, z, out [T, H, D]; w [D].
  virtual void GatedRmsNorm(const TensorView& x, const TensorView& z, const TensorView& w, float eps,
                            const TensorView& out);

  // --- graphs ---------------------------------------------------------------------------
  // Work recorded once and replayed with the same buffers (CUDA graphs). The CPU backend has
  // none: CaptureGraph answers Unsupported and callers run eagerly.
  class Graph {
   public:
    virtual ~Graph() = default;
    virtual void Replay() = 0;  // enqueues one replay; does not wait for it
  };
  virtual bool supports_graphs() const { return false; }
  // Runs fn() once eagerly (warming per-shape caches), then records what a second fn()
  // enqueues. What fn() allocates comes from memory reserved for graphs, so the addresses a
  // replay touches stay theirs; tensors fn() reads or writes that it did not allocate must
  // outlive the graph at the same address. fn() must not synchronise the host (that aborts).
  virtual Result<std::unique_ptr<Graph>> CaptureGraph(const std::function<void()>& fn) {
    (void)fn;
    return Unsupported(name() + " does not capture graphs");
  }

  // One token per row of logits [B, V] (f32 or the activation dtype); params [B]; `steps` [B]
  // counters for the per-request random stream. out_ids [B] i32 (host memory).
  virtual void Sample(const TensorView& logits, const SamplingParams* params, const uint64_t* steps,
                      int32_t* out_ids) = 0;

  // --- asynchronous sampling (the engine's overlapped steps) -----------------------------
  // Sampled ids on their way to the host.
  class PendingIds {
   public:
    virtual ~PendingIds() = default;  // implementations wait for the copy to land first
    // Blocks until the ids are on the host; returns them ([B] i32, valid while this lives).
    virtual const int32_t* Wait() = 0;
  };
  // Sample without waiting for the device: the ids go to `ids` ([B] i32, this backend's
  // memory, where later work may read them, e.g. the next step's input ids) and a copy of
  // them starts towards the host. The default samples through Sample (synchronously: the CPU).
  virtual std::unique_ptr<PendingIds> SampleAsync(const TensorView& logits, const SamplingParams* params,
                                                  const uint64_t* steps, const TensorView& ids);

  // --- fused attention prologue (last in the class: new virtuals go at the end) ---------
  // What Qwen3's attention runs between its qkv projection and Attention: HeadRmsNorm of q
  // [T, Hq, D] with q_norm_w and of k [T, Hk, D] with k_norm_w, Rope of both, then KvWrite of
  // k and v [T, Hk, D]. The default runs those four ops; a backend may fuse them (CUDA does for
  // whole-head neox rotary), keeping the normalised values in f32 into the rotation.
  virtual void QkNormRopeKvWrite(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& q_norm_w, const TensorView& k_norm_w, float eps,
                                 const TensorView& positions, const RopeParams& rope, const KvCacheView& cache,
                                 const AttentionBatch& batch);

  // --- FP8 block-scaled linear (DeepSeek-V3 checkpoints) ---------------------------------
  // out = x @ W^T where W = w * w_scale by 128 x 128 block: w [N, K] e4m3 (contiguous),
  // w_scale [ceil(N/128), ceil(K/128)] f32 with row stride Fp8ScaleStride(K) (cuBLASLt's
  // layout). x [T, K] (activation dtype, rows may be strided) is quantised on the fly the
  // DeepSeek way, per row and group of 128 columns (the last group may be shorter):
  //   sx = max(amax, kFp8MinAmax) / 448,  q = e4m3(x / sx)  (nearest even, saturating);
  //   out[t, n] = sum_g sx[t, g] * w_scale[n / 128, g] * sum_{k in g} q[t, k] w[n, k]  (f32).
  // out [T, N] of the activation dtype, rows may be strided. Backends without it answer false
  // to supports_linear_fp8 (the default); a model dequantises the weights they do not take.
  virtual bool supports_linear_fp8(int64_t n, int64_t k) const {
    (void)n, (void)k;
    return false;
  }
  virtual void LinearFp8(const TensorView& x, const TensorView& w, const TensorView& w_scale,
                         const TensorView& out);
  // --- batched projections (after the fused prologue: new virtuals go at the end) ---------
  // out[:, b] = x[:, b] @ w[b]^T for each b: x [T, B, K], w [B, N, K], out [T, B, N]. Any
  // strides with a contiguous innermost dimension, so per-head column slices need no copy
  // (MLA's absorbed GEMMs: x = q_nope as [T, heads, nope] inside q [T, heads, nope + rope]);
  // out must not overlap x or w. The CPU runs one Linear per b; CUDA one strided-batched GEMM.
  virtual void BatchedLinear(const TensorView& x, const TensorView& w, const TensorView& out) = 0;
  // --- fused router (last in the class: new virtuals go at the end) ---------------------
  // MoeRoute of the router logits x [T, H] @ w_router [E, H]^T (f32): topk_ids [T, K] i32,
  // topk_weights [T, K] f32; w_router is a weight, as Linear's w. The default runs Linear into
  // f32 logits, then MoeRoute; a backend may fuse the two (CUDA does for a few tokens: one
  // launch instead of two).
  virtual void MoeRouter(const TensorView& x, const TensorView& w_router, const MoeRouting& routing,
                         const TensorView& topk_ids, const TensorView& topk_weights);
  // --- side stream (new virtuals go at the end of the class) ------------------------------
  // Work that may run beside the main stream (DP-EP: the shared expert while the tokens are
  // exchanged). RunOnSideStream enqueues what fn() enqueues on a second stream, ordered after
  // everything enqueued before the call; the ops after it go to the main stream again, which
  // does not wait for the side's work until JoinSideStream (one join per RunOnSideStream, before
  // anything reads what fn() wrote). Memory freed between the two calls is not handed out again
  // before the join, so tensors fn() allocates may die inside it. Both are legal inside
  // CaptureGraph (CUDA: an event fork and join). fn() must not synchronise the host nor run
  // collectives (an exchange must never need side-stream work to progress). The default (CPU)
  // runs fn() in place and joins nothing: the same ops in the same order.
  virtual void RunOnSideStream(const std::function<void()>& fn) { fn(); }
  virtual void JoinSideStream() {}
  // --- FP8 routed experts (after the side stream: new virtuals go at the end) ------------------
  // MoeExperts with block-scaled e4m3 weights (DeepSeek-V3 checkpoints): W = w * scale by
  // 128 x 128 block of each expert's matrix.
  //   w_gate_up [E, 2I, H] e4m3 (gate rows first), gu_scale [E, 2 ceil(I/128), ceil(H/128)] f32:
  //     scale rows [0, ceil(I/128)) are the gate's blocks, then the up's (so an I that is not a
  //     multiple of 128 keeps each half's own blocks, as the checkpoint stores them);
  //   w_down [E, H, I] e4m3, d_scale [E, ceil(H/128), ceil(I/128)] f32; all contiguous.
  // x, out, topk_ids, topk_weights and the skipping of ids outside [0, E) as MoeExperts.
  // Activation math, per regime (what the CPU twin cpu::MoeExpertsFp8 reproduces with its
  // quantize_activations flag):
  //   weight-only (CUDA for few (token, expert) pairs, the CPU backend always): activations
  //     stay bf16/f32, times w * scale, f32 accumulation (= MoeExperts of the dequantised W);
  //   quantised (CUDA grouped path): x and the SiLU-mul output (rounded to bf16 first) are
  //     quantised per row and group of 128 columns as LinearFp8 does (sx = max(amax,
  //     kFp8MinAmax) / 448), e4m3 x e4m3 products, per 128-wide k block sum * sx * scale in f32.
  // Backends without it answer false to supports_moe_fp8 (the default); a model dequantises.
  virtual bool supports_moe_fp8(int64_t hidden, int64_t inter) const {
    (void)hidden, (void)inter;
    return false;
  }
  virtual void MoeExpertsFp8(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                             const TensorView& w_gate_up, const TensorView& gu_scale, const TensorView& w_down,
                             const TensorView& d_scale, const TensorView& out);
  // --- fused decode of a whole MoE stack (after the FP8 experts: new virtuals go at the end) ---
  // Every layer of `stack` on a batch of one decode token: on entry sum [1, H] holds the
  // residual stream before the first layer (the embedded token); on return sum holds it after
  // the last layer and x [1, H] = rmsnorm(sum) * stack.final_norm. Each layer is, with the
  // rounding of the op-by-op path: x = rmsnorm(sum) * input_norm; Qwen3 attention (qkv, QK norm,
  // RoPE, this token's K/V into the cache, attention, o); sum += o; x = rmsnorm(sum) *
  // post_attention_norm; routed experts; sum += their output. Returns false, having enqueued
  // nothing, where the backend has no fused path for these shapes (the default: the caller then
  // runs the ops). CUDA: one persistent launch (kernels/cuda/decode_stack.cu).
  virtual bool DecodeMoeStack(const MoeDecoderStack& stack, const AttentionBatch& batch, const TensorView& positions,
                              const TensorView& sum, const TensorView& x) {
    (void)stack, (void)batch, (void)positions, (void)sum, (void)x;
    return false;
  }
  // --- a MoE layer's post-attention norm and router in one op (new virtuals go at the end) ---
  // RmsNorm(y, norm_w, eps, x, &sum) (sum += y; x = rmsnorm(sum) * norm_w), then MoeRouter(x,
  // w_router, routing, topk_ids, topk_weights). The default runs the two; a backend may fuse them
  // (CUDA for one token with Tuning().staged_router_norm: one launch instead of three).
  virtual void RmsNormMoeRouter(const TensorView& y, const TensorView& norm_w, float eps, const TensorView& sum,
                                const TensorView& x, const TensorView& w_router, const MoeRouting& routing,
                                const TensorView& topk_ids, const TensorView& topk_weights) {
    RmsNorm(y, norm_w, eps, x, &sum);
    MoeRouter(x, w_router, routing, topk_ids, topk_weights);
  }
  // RmsNorm(y, norm_w, eps, x, &sum), then Linear(x, w, out): a layer's input norm and its first
  // projection. The default runs the two; a backend may fuse them (CUDA for one row with
  // Tuning().gemv_staged_norm: one launch).
  virtual void RmsNormLinear(const TensorView& y, const TensorView& norm_w, float eps, const TensorView& sum,
                             const TensorView& x, const TensorView& w, const TensorView& out) {
    RmsNorm(y, norm_w, eps, x, &sum);
    Linear(x, w, out);
  }
  // QkNormRopeKvWrite(q, k, v, ...), then Attention(q, cache, batch, scale, out): Qwen3's
  // attention from its raw q / k / v projections. q and k are scratch afterwards (the default
  // leaves them normalised and rotated, a fused backend may leave them as they were). The
  // default runs the two; CUDA folds the prologue into its decode attention (one query token a
  // sequence, Tuning().attention_fused_prologue: one launch instead of two).
  virtual void QkNormRopeAttention(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& q_norm_w, const TensorView& k_norm_w, float eps,
                                   const TensorView& positions, const RopeParams& rope, const KvCacheView& cache,
                                   const AttentionBatch& batch, float scale, const TensorView& out) {
    QkNormRopeKvWrite(q, k, v, q_norm_w, k_norm_w, eps, positions, rope, cache, batch);
    Attention(q, cache, batch, scale, out);
  }
  // QkNormRopeAttention(..., attn), then Linear(attn [T, Hq D], w_o, out): Qwen3's attention and
  // its output projection (no output gate). The default runs the two; CUDA folds the projection
  // into the decode attention for one token (Tuning().attention_region: one launch for the
  // prologue, the attention and o_proj).
  virtual void QkNormRopeAttentionProj(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const TensorView& q_norm_w, const TensorView& k_norm_w, float eps,
                                       const TensorView& positions, const RopeParams& rope, const KvCacheView& cache,
                                       const AttentionBatch& batch, float scale, const TensorView& attn,
                                       const TensorView& w_o, const TensorView& out) {
    QkNormRopeAttention(q, k, v, q_norm_w, k_norm_w, eps, positions, rope, cache, batch, scale, attn);
    Linear(attn.Reshape({attn.dim(0), attn.dim(1) * attn.dim(2)}), w_o, out);
  }
  // Whether QkNormRopeAttention may run as one fused op for this batch (profilers then time it as
  // one; otherwise as its two ops).
  virtual bool fuses_qk_norm_rope_attention(const AttentionBatch& batch) const {
    (void)batch;
    return false;
  }
  // --- a MoE layer's output folded into the residual stream (new virtuals go at the end) ---
  // Whether models take MoeExpertsResidual + NormLinear (below) instead of MoeExperts followed by
  // the next layer's RmsNormLinear, for `tokens` rows: where the backend runs them faster (the
  // default: never; CUDA for one token with Tuning().moe_residual_fold, where it folds them).
  virtual bool folds_moe_residual(int64_t tokens) const {
    (void)tokens;
    return false;
  }
  // MoeExperts(x, ..., out), then sum += out with RmsNorm's rounding of its residual add: the
  // experts' output folded into the stream, so that the next layer's input norm (NormLinear) has
  // nothing left to add. The default runs MoeExperts and Add; CUDA folds the add into its
  // few-token down kernel.
  virtual void MoeExpertsResidual(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                                  const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out,
                                  const TensorView& sum) {
    MoeExperts(x, topk_ids, topk_weights, w_gate_up, w_down, out);
    Add(sum, out);
  }
  // x = rmsnorm(sum) * norm_w, then Linear(x, w, out): RmsNormLinear after MoeExpertsResidual (sum
  // already holds the block's output). The default runs RmsNorm and Linear; CUDA folds the norm
  // into the staged GEMV of one row.
  virtual void NormLinear(const TensorView& norm_w, float eps, const TensorView& sum, const TensorView& x,
                          const TensorView& w, const TensorView& out) {
    RmsNorm(sum, norm_w, eps, x, nullptr);
    Linear(x, w, out);
  }
  // --- the step's shape, for kernel planning (new virtuals go at the end) ------------------
  // A model's Forward calls this first with its batch's attention metadata and its `tokens`; the
  // ops until the next call may plan their kernels from its host-side hints. The default ignores
  // it; the CUDA backend sizes the MoE grouped GEMM's tiles by whether one prompt chunk holds most
  // of the step's tokens (their routing is uneven: tokens of one context share experts).
  virtual void PlanStep(const AttentionBatch& /*batch*/, int64_t /*tokens*/) {}
  // Before a MoE layer's attention: its tokens will be routed by `router` [E, H] from the
  // post-attention norm (`norm_w`) of `sum` plus the attention's output, top `top_k` of a
  // softmax. A hint: a backend may predict the routing from `sum` alone (the attention's output
  // moves it little) to fetch the likely experts early; no result may depend on it. `gate_up`
  // [E, 2I, H] and `down` [E, H, I] are the experts' weights it would fetch. The default ignores
  // it; CUDA (Tuning().moe_predict) predicts one token's picks in the layer's o_proj.
  virtual void HintMoeRouting(const TensorView& /*norm_w*/, const TensorView& /*sum*/, const TensorView& /*router*/,
                              const TensorView& /*gate_up*/, const TensorView& /*down*/, int /*top_k*/) {}
};

// FP8 block scaling: 128 x 128 weight blocks, 1 x 128 activation groups.
constexpr int64_t kFp8Block = 128;
constexpr float kFp8Max = 448.0f;     // largest finite e4m3
constexpr float kFp8MinAmax = 1e-4f;  // floor of a group's amax (an all-zero group gets a finite scale)
// Row stride (in floats) of LinearFp8's w_scale for K input columns: ceil(K/128) rounded up to 4.
inline int64_t Fp8ScaleStride(int64_t k) { return ((k + kFp8Block - 1) / kFp8Block + 3) / 4 * 4; }

std::unique_ptr<Backend> MakeCpuBackend();
// The CUDA backend on device `device_idx` (kernels/cuda; only in builds with COROLLA_CUDA=ON).
Result<std::unique_ptr<Backend>> MakeCudaBackend(int device_idx);
// Returns an error when the binary was built without CUDA or no device is present.
Result<std::unique_ptr<Backend>> MakeBackend(const std::string& device);

}  // namespace corolla
