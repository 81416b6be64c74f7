// `corolla bench decode|prefill`: the speed of one model forward against the device's limits
// measured in the same run. Decode is memory-bound: the bytes a step must read (attention and
// dense weights, the distinct routed experts, the LM head, the KV cache) over the step time,
// against the HBM copy bandwidth. Prefill is compute-bound: FLOPs over time against the bf16
// matmul peak (one large GEMM through the backend's Linear). With --random-weights and
// --config, no checkpoint is needed. On CUDA, steps are timed with events on the backend's
// stream, and decode is also replayed as one CUDA graph per step.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/numeric.h"
#include "cli/commands.h"
#include "cli/expert_load.h"
#include "cli/flags.h"
#include "cli/model_options.h"
#include "engine/decode_graphs.h"
#include "engine/kv_budget.h"
#include "engine/kv_cache.h"
#include "kernels/profiling_backend.h"
#include "model/config.h"
#include "model/random_weights.h"
#include "model/weights.h"
#include "parallel/launcher.h"

#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/graph_timer.h"
#endif

namespace corolla::cli {
namespace {

struct BenchOptions {
  std::string model;
  std::string config;
  bool random_weights = false;
  std::string device = "cuda";
  std::string batch = "1";      // comma-separated: one measurement each, one model load
  std::string context = "1024";
  int64_t layers = 0;
  int64_t steps = 20;
  int64_t seed = 1;
  bool graph = true;
  bool plan_bucket = false;  // decode: attention planned on the engine's context bucket
  bool breakdown = false;
  bool expert_load = false;  // prefill: rows an expert of one step's MoE layers
  std::string skip_ops;  // comma-separated op labels not run (ProfilingBackend::SkipOps)
  bool marginal = false;  // decode: the step without each op kind in turn
  int64_t tp = 1;             // decode: tensor-parallel ranks (experts split over them: TP-EP)
  int64_t dp = 1, ep = 0;     // decode: data-parallel ranks, each with --batch sequences; expert-parallel ranks
  int64_t ep_capacity = -1;   // DP-EP fixed exchange rows per rank (-1: the largest --batch; 0: sized per layer)
  int64_t decode_rows =
      0;  // prefill: sequences decoding one token beside the prompts (a mixed step)
  int64_t decode_context = 1024;  // prefill: their context (cached keys + the new token)
  std::string linear_state_dtype = "f32";
  DType state_dtype = DType::kF32;  // parsed --linear-state-dtype
  std::vector<int32_t> batches, contexts;  // parsed --batch, --context
};

// Times device work: CUDA events on the backend's stream when it is the CUDA backend, else a
// host clock between synchronisations. Times in milliseconds.
class DeviceTimer {
 public:
  explicit DeviceTimer(Backend& backend) : backend_(backend) {
#ifdef COROLLA_HAVE_CUDA
    events_ = cuda::StreamTimer::Create(backend);
#endif
  }
  double Time(const std::function<void()>& fn) {
#ifdef COROLLA_HAVE_CUDA
    if (events_) return events_->Time(fn);
#endif
    backend_.Synchronize();
    auto t0 = std::chrono::steady_clock::now();
    fn();
    backend_.Synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  // Median of `reps` timings of fn.
  double Median(int reps, const std::function<void()>& fn) {
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) t.push_back(Time(fn));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  bool events() const {
#ifdef COROLLA_HAVE_CUDA
    return events_ != nullptr;
#else
    return false;
#endif
  }

 private:
  Backend& backend_;
#ifdef COROLLA_HAVE_CUDA
  std::unique_ptr<cuda::StreamTimer> events_;
#endif
};

// A device tensor of random bf16 (activation dtype) values in [-scale, scale].
Tensor RandomDevice(Backend& backend, Shape shape, float scale, uint64_t seed) {
  Tensor t = backend.Empty(backend.activation_dtype(), shape);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  const int64_t n = shape.numel();
  if (backend.activation_dtype() == DType::kBF16) {
    std::vector<bf16> host(n);
    for (auto& v : host) v = ToBf16(u(rng));
    backend.CopyFromHost(host.data(), t);
  } else {
    std::vector<float> host(n);
    for (auto& v : host) v = u(rng);
    backend.CopyFromHost(host.data(), t);
  }
  backend.Synchronize();
  return t;
}

// HBM copy bandwidth (bytes read + written per second) of a 4 GiB device-to-device copy:
// cudaMemcpyAsync on CUDA; elsewhere (the CPU) a 256 MiB copy through the backend's Copy.
double MeasureCopyBandwidth(Backend& backend, DeviceTimer& timer) {
#ifdef COROLLA_HAVE_CUDA
  if (auto events = cuda::StreamTimer::Create(backend)) return events->CopyBandwidth(size_t{4} << 30);
#endif
  // 256 MiB of activations: far past the caches of a CPU.
  const DType dtype = backend.activation_dtype();
  const int64_t cols = 4096, rows = (int64_t{256} << 20) / (cols * DTypeSize(dtype));
  Tensor a = backend.Empty(dtype, {rows, cols});
  Tensor b = backend.Empty(dtype, {rows, cols});
  Tensor seed_block = RandomDevice(backend, {1024, cols}, 1.0f, 7);
  for (int64_t r = 0; r < rows; r += 1024)  // random contents, not zeros
    backend.Copy(seed_block.view().Slice(0, std::min<int64_t>(rows, r + 1024) - r), a.view().Slice(r, std::min<int64_t>(rows, r + 1024)));
  backend.Copy(a, b);
  const double ms = timer.Median(7, [&] { backend.Copy(a, b); });
  return 2.0 * static_cast<double>(a.view().nbytes()) / (ms * 1e-3);
}

// Matmul rate (FLOP/s) of an n^3 GEMM through the backend's Linear, random operands: 8192^3 in
// bf16 on a GPU; 1024^3 (in its f32) on the CPU, where a larger one takes minutes and rates no higher.
double MeasureMatmulPeak(Backend& backend, DeviceTimer& timer) {
  const int64_t n = backend.device() == Device::kCpu ? 1024 : 8192;
  Tensor x = RandomDevice(backend, {n, n}, 1.0f, 11);
  Tensor w = RandomDevice(backend, {n, n}, 0.02f, 12);
  Tensor out = backend.Empty(backend.activation_dtype(), {n, n});
  backend.Linear(x, w, out);
  const double ms = timer.Median(7, [&] { backend.Linear(x, w, out); });
  return 2.0 * n * n * n / (ms * 1e-3);
}

struct Loaded {
  std::unique_ptr<Backend> backend;  // what the model calls: the device's, or a ProfilingBackend around it
  std::unique_ptr<ParallelContext> parallel;  // --dp > 1; outlives the model
  ModelShard shard;
  std::unique_ptr<Model> model;
  Backend* device = nullptr;              // the device's own backend (timers and graphs need it)
  ProfilingBackend* profiler = nullptr;  // with --breakdown
  ProfilingBackend* skipper = nullptr;   // with --breakdown, --skip-op or --marginal
  ProfilingBackend* observer = nullptr;  // with --expert-load
  std::vector<std::string> skip;         // --skip-op's labels
  int64_t free_bytes = -1;               // the device's free memory once loaded (-1: not reported)
};

// Comma-separated labels.
std::vector<std::string> SplitLabels(const std::string& list) {
  std::vector<std::string> labels;
  for (size_t begin = 0; begin < list.size();) {
    const size_t end = std::min(list.find(',', begin), list.size());
    if (end > begin) labels.push_back(list.substr(begin, end - begin));
    begin = end + 1;
  }
  return labels;
}

Result<Loaded> Load(const BenchOptions& o) {
  Loaded l;
  const int capacity = static_cast<int>(o.ep_capacity >= 0 ? o.ep_capacity : *std::max_element(o.batches.begin(), o.batches.end()));
  ASSIGN_OR_RETURN(RankSetup setup, SetUpRank(o.device, {static_cast<int>(o.tp), static_cast<int>(o.ep), static_cast<int>(o.dp)},
                                              capacity));
  l.backend = std::move(setup.backend);
  l.parallel = std::move(setup.parallel);
  l.shard = setup.shard;
  l.device = l.backend.get();
  if (o.breakdown || !o.skip_ops.empty() || o.marginal || o.expert_load) {
    auto profiler = std::make_unique<ProfilingBackend>(std::move(l.backend));
    l.skip = SplitLabels(o.skip_ops);
    profiler->SkipOps(l.skip);
    if (o.breakdown) l.profiler = profiler.get();
    if (o.expert_load) l.observer = profiler.get();
    l.skipper = profiler.get();
    l.backend = std::move(profiler);
  }
  if (o.random_weights) {
    if (o.config.empty()) return InvalidArgument("--random-weights needs --config CONFIG.json");
    ASSIGN_OR_RETURN(std::string text, ReadFile(o.config));
    ASSIGN_OR_RETURN(nlohmann::json json, ParseJson(text, o.config));
    ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(json));
    if (o.layers > 0) {
      config.num_layers = static_cast<int>(std::min<int64_t>(o.layers, config.num_layers));
      config.layer_kinds.resize(config.num_layers);
    }
    auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(l.model, LoadModelRandom(config, *l.backend, static_cast<uint64_t>(o.seed), l.shard));
    std::printf("loaded %s with random weights, %d layers, in %.1f s\n", o.config.c_str(), config.num_layers,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  } else {
    if (o.model.empty()) return InvalidArgument("give --model DIR, or --config CONFIG.json --random-weights");
    if (o.layers > 0) return InvalidArgument("--layers needs --random-weights");
    ASSIGN_OR_RETURN(l.model, LoadModel(o.model, *l.backend, l.shard));
  }
  if (Result<Backend::MemoryInfo> memory = l.device->QueryMemory(); memory.ok()) l.free_bytes = memory->free_bytes;
  return l;
}

// Whether B sequences of `tokens` cached tokens each (their KV blocks and activations,
// EstimateActivationBytes) fit the memory free once the model was loaded; prints why not, so
// that a sweep goes on past a combination the device cannot hold instead of aborting in the
// allocator. (Blocks freed by the combination before sit in the allocator's cache, which it
// releases before it gives up.)
bool StepFits(const Loaded& l, const char* what, int num_seqs, int tokens, int new_tokens) {
  if (l.free_bytes < 0) return true;
  constexpr int kBlockSize = 16;  // MakeStepBatch's
  const int64_t blocks = int64_t{num_seqs} * ((tokens + kBlockSize - 1) / kBlockSize);
  const int64_t kv = blocks * KvCache::BytesPerBlock(l.model->kv_cache_spec(), kBlockSize, l.device->activation_dtype());
  const int64_t batch_tokens = std::min<int64_t>(int64_t{num_seqs} * new_tokens, std::numeric_limits<int>::max());
  const int64_t need = kv + EstimateActivationBytes(l.model->config(), static_cast<int>(batch_tokens), num_seqs);
  if (need <= l.free_bytes) return true;
  std::printf("%s: batch %d, %d tokens a sequence: skipped, its KV cache (%.1f GB) and activations need %.1f GB, "
              "%.1f GB free after loading\n",
              what, num_seqs, tokens, kv / 1e9, need / 1e9, l.free_bytes / 1e9);
  std::fflush(stdout);
  return false;
}

// Weights one token's forward reads per layer (bytes of bf16), apart from the routed experts.
struct ModelBytes {
  double dense_per_layer_total = 0;  // attention (+ dense MLP) weights of all layers
  double expert = 0;                 // one expert's gate_up + down
  double router = 0;                 // per MoE layer
  int moe_layers = 0;
  double lm_head = 0;
  double kv_per_token_all_layers = 0;  // K + V of one cached token, all layers (MLA: the latent)
  double state_per_seq = 0;            // hybrids: linear-attention states read and written per step
};

// fp8: DeepSeek's projections held block-scaled FP8 (--fp8 native on an FP8 config): one byte a
// weight for q_a/q_b/kv_a/o, the MLPs and the experts (kv_b, router, norms, LM head stay bf16).
ModelBytes CountBytes(const ModelConfig& c, DType state_dtype, bool fp8) {
  ModelBytes b;
  const double h = c.hidden_size, two = 2.0, proj = fp8 ? 1.0 : 2.0;
  const LinearAttentionConfig& la = c.linear;
  const MlaConfig& m = c.mla;
  const bool mla = m.kv_lora_rank > 0;
  for (int l = 0; l < c.num_layers; ++l) {
    const bool linear = !c.layer_kinds.empty() && c.layer_kinds[l] == LayerKind::kLinearAttention;
    if (linear) {  // Gated DeltaNet: in_proj (q|k|v|z|b|a), conv, out_proj, norm
      b.dense_per_layer_total += two * ((la.conv_channels() + la.value_dim() + 2.0 * la.num_value_heads) * h +
                                        la.conv_channels() * la.conv_kernel + h * la.value_dim() + la.value_head_dim);
      b.state_per_seq += DTypeSize(state_dtype) * 2.0 * la.num_value_heads * la.key_head_dim * la.value_head_dim +
                         4.0 * 2.0 * la.conv_channels() * (la.conv_kernel - 1);  // read + write; conv state f32
    } else if (mla) {  // q_a, q_b (or q), kv_a, kv_b (as W_UK / W_UV), o
      const double heads = c.num_attention_heads;
      const double q = m.q_lora_rank > 0 ? m.q_lora_rank * h + heads * m.qk_head_dim() * m.q_lora_rank
                                         : heads * m.qk_head_dim() * h;
      b.dense_per_layer_total += proj * (q + (m.kv_lora_rank + m.qk_rope_head_dim) * h + h * heads * m.v_head_dim) +
                                 two * heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank;
      b.kv_per_token_all_layers += two * (m.kv_lora_rank + m.qk_rope_head_dim);  // the latent, K and V at once
    } else {
      const double q_rows = c.q_size() * (c.attention_output_gate ? 2.0 : 1.0);
      b.dense_per_layer_total += two * ((q_rows + 2.0 * c.kv_size()) * h + h * c.q_size() + 2.0 * c.head_dim);
      b.kv_per_token_all_layers += two * 2.0 * c.num_kv_heads * c.head_dim;
    }
    b.dense_per_layer_total += two * 2 * h;  // the two norms
    if (c.is_moe_layer(l)) {
      ++b.moe_layers;
      const double shared = c.shared_expert_intermediate_size + static_cast<double>(c.moe_intermediate_size) * c.num_shared_experts;
      b.dense_per_layer_total += proj * 3.0 * shared * h + two * (c.shared_expert_intermediate_size > 0 ? h : 0.0);
    } else {
      b.dense_per_layer_total += proj * 3.0 * c.intermediate_size * h;
    }
  }
  b.expert = proj * 3.0 * c.moe_intermediate_size * h;
  b.router = two * c.num_experts * h;
  b.lm_head = two * c.vocab_size * h + two * h;
  return b;
}

// FLOPs of one token's forward apart from attention scores (2 per weight multiply-add).
double FlopsPerToken(const ModelConfig& c) {
  const double h = c.hidden_size;
  double f = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    f += 2.0 * ((c.q_size() + 2.0 * c.kv_size()) * h + h * c.q_size());
    if (c.is_moe_layer(l))
      f += 2.0 * (c.num_experts * h + c.num_experts_per_token * 3.0 * c.moe_intermediate_size * h);
    else
      f += 2.0 * 3.0 * c.intermediate_size * h;
  }
  return f;
}

// B sequences, each with `len` tokens in this step after `prefix` cached ones, in a paged
// cache whose prefixes hold random K/V. Metadata lives on the device for the whole run.
struct StepBatch {
  std::unique_ptr<KvCache> kv;
  std::vector<Tensor> owned;
  ForwardBatch batch;
  Tensor logits;
};

Tensor Ints(Backend& backend, const std::vector<int32_t>& v, Shape shape) {
  Tensor t = backend.Empty(DType::kI32, shape);
  backend.CopyFromHost(v.data(), t);
  return t;
}

// One sequence of a step: `len` new tokens after `prefix` cached ones.
struct SeqShape {
  int prefix, len;
};

StepBatch MakeStepBatch(Backend& backend, const Model& model, const std::vector<SeqShape>& shapes,
                        uint64_t seed, DType state_dtype) {
  const ModelConfig& c = model.config();
  constexpr int kBlockSize = 16;
  const int num_seqs = static_cast<int>(shapes.size());
  int blocks_per_seq = 1, max_q_len = 0, max_seq_len = 0;
  for (const SeqShape& sh : shapes) {
    blocks_per_seq = std::max(blocks_per_seq, (sh.prefix + sh.len + kBlockSize - 1) / kBlockSize);
    max_q_len = std::max(max_q_len, sh.len);
    max_seq_len = std::max(max_seq_len, sh.prefix + sh.len);
  }
  StepBatch s;
  s.kv = std::make_unique<KvCache>(backend, model.kv_cache_spec(), num_seqs * blocks_per_seq, kBlockSize,
                                   model.state_spec().WithRecurrentDtype(state_dtype),
                                   model.state_spec().num_layers > 0 ? num_seqs : 0);
  // Random K/V everywhere: one random layer's worth on the device, copied into every layer
  // (a truncated hybrid may have no attention layer at all).
  if (!s.kv->views().empty()) {
    const KvCacheView& first = s.kv->views()[0];
    const int64_t rows = first.k.dim(0) * first.k.dim(1);
    Tensor random_kv = RandomDevice(backend, {rows, first.k.dim(2), first.k.dim(3)}, 1.0f, seed + 1);
    for (const KvCacheView& v : s.kv->views()) {
      backend.Copy(random_kv, v.k.Reshape({rows, v.k.dim(2), v.k.dim(3)}));
      backend.Copy(random_kv, v.v.Reshape({rows, v.v.dim(2), v.v.dim(3)}));
    }
  }
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> tokens, positions, slots, query_start{0}, seq_lens, tables, rows_out;
  for (int b = 0; b < num_seqs; ++b) {
    const int prefix = shapes[b].prefix, len = shapes[b].len;
    for (int j = 0; j < blocks_per_seq; ++j) tables.push_back(b * blocks_per_seq + j);
    for (int p = prefix; p < prefix + len; ++p) {
      tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
      positions.push_back(p);
      slots.push_back((b * blocks_per_seq + p / kBlockSize) * kBlockSize + p % kBlockSize);
    }
    query_start.push_back(query_start.back() + len);
    seq_lens.push_back(prefix + len);
    rows_out.push_back(query_start.back() - 1);  // logits of each sequence's last token
  }
  const int64_t t = static_cast<int64_t>(tokens.size());
  s.owned = {Ints(backend, tokens, {t}), Ints(backend, positions, {t}),
             Ints(backend, query_start, {num_seqs + 1}), Ints(backend, seq_lens, {num_seqs}),
             Ints(backend, tables, {num_seqs, blocks_per_seq}), Ints(backend, slots, {t}),
             Ints(backend, rows_out, {num_seqs})};
  s.batch.token_ids = s.owned[0];
  s.batch.positions = s.owned[1];
  s.batch.attention = {s.owned[2], s.owned[3], s.owned[4], s.owned[5], max_q_len, max_seq_len};
  while (s.batch.attention.num_decode_seqs < num_seqs &&
         shapes[s.batch.attention.num_decode_seqs].len == 1)
    ++s.batch.attention.num_decode_seqs;
  s.batch.logits_rows = s.owned[6];
  if (s.kv->has_state()) {
    // Hybrids: one state slot per sequence, zeroed (a continuing sequence reads it).
    std::vector<int32_t> state_slots;
    for (int b = 0; b < num_seqs; ++b) state_slots.push_back(s.kv->AllocateStateSlot());
    s.owned.push_back(Ints(backend, state_slots, {num_seqs}));
    s.batch.state_slots = s.owned.back();
    s.batch.linear_states = s.kv->state_views();
    int64_t largest = 0;
    for (const LinearStateView& st : s.kv->state_views())
      largest = std::max({largest, st.conv.numel(), st.recurrent.numel()});
    const std::vector<float> zeros(largest, 0.0f);
    for (const LinearStateView& st : s.kv->state_views()) {
      backend.CopyFromHost(zeros.data(), st.conv);
      backend.CopyFromHost(zeros.data(), st.recurrent);
    }
    backend.Synchronize();
  }
  s.logits = backend.Empty(DType::kF32, {num_seqs, c.vocab_size});
  backend.Synchronize();
  return s;
}

Status ParseOptions(const char* name, const char* summary, int argc, char** argv, BenchOptions* o, bool* help) {
  Flags flags(std::string("bench ") + name, summary);
  flags.String("model", &o->model, "Hugging Face checkpoint directory");
  flags.String("config", &o->config, "config.json of the shape to measure (with --random-weights)");
  flags.Bool("random-weights", &o->random_weights,
             "random weights of --config's shape, no checkpoint (bf16; DeepSeek's projections block-scaled FP8 "
             "for an fp8 config under COROLLA_FP8=native)");
  flags.String("device", &o->device, "cpu or cuda");
  flags.String("batch", &o->batch, "sequences in the batch (a comma-separated list measures each)");
  flags.String("context", &o->context,
               "decode: context length of each sequence; prefill: prompt length (a list measures each)");
  flags.Int("layers", &o->layers, "keep only the first K decoder layers (0: all; --random-weights only)");
  flags.Int("steps", &o->steps, "timed repetitions (the median is reported)");
  flags.Int("seed", &o->seed, "seed of the random weights, tokens and KV");
  flags.Bool("graph", &o->graph, "decode on CUDA: also replay each step as a CUDA graph");
  flags.Bool("plan-bucket", &o->plan_bucket,
             "decode: plan the attention on the engine's decode-graph context bucket (256, 512, "
             "... holding the context), as serving does, instead of on the context itself");
  flags.Bool("breakdown", &o->breakdown,
             "also print the time of each op kind in one step (decode on CUDA: from a graph replay)");
  flags.String("skip-op", &o->skip_ops,
               "comma-separated op labels (as --breakdown names them, or their first words) not to run: the step time "
               "without them is their marginal cost; the outputs are meaningless then");
  flags.Bool("marginal", &o->marginal,
             "decode: also time the step without each op kind in turn (the labels of --breakdown, one model "
             "load) and print each one's marginal cost; outputs past a skipped op are meaningless (a skipped "
             "router changes which experts run)");
  flags.String("linear-state-dtype", &o->linear_state_dtype,
               "hybrid models: storage of the Gated DeltaNet recurrent state, f32 or bf16");
  if (std::string(name) == "prefill") {
    flags.Bool("expert-load", &o->expert_load,
               "also run one step recording each MoE layer's routing: rows an expert and the "
               "grouped GEMMs' 128-row tiles (full, tails) they make");
    flags.Int("decode-rows", &o->decode_rows,
              "sequences that decode one token in the same step, ahead of the prompts "
              "(the engine's mixed steps under chunked prefill)");
    flags.Int("decode-context", &o->decode_context,
              "context of each --decode-rows sequence, its new token included");
  }
  if (std::string(name) == "decode") {
    flags.Int("tp", &o->tp, "tensor-parallel ranks, one process per GPU, the experts split over them (TP-EP)");
    flags.Int("dp", &o->dp, "data-parallel ranks, one process per GPU, each running --batch sequences");
    flags.Int("ep", &o->ep, "expert-parallel ranks: --tp (default: replicas of TP-EP) or --dp x --tp (DP-EP: experts split "
            "over all ranks, tokens exchanged; with --tp > 1 each TP rank of a replica dispatches 1/tp of its batch)");
    flags.Int("ep-capacity", &o->ep_capacity,
              "DP-EP: rows per rank of the fixed-size exchanges, which CUDA graphs can capture (with --tp > 1 "
              "per replica: each TP rank's exchange moves 1/tp of them; default: the largest --batch; 0: sizes "
              "exchanged in every MoE layer, eager only)");
  }
  RETURN_IF_ERROR(flags.Parse(argc, argv, argc > 1 && std::string(argv[1]) == "bench" ? 3 : 2, help));
  if (*help) return Status::Ok();
  ASSIGN_OR_RETURN(o->state_dtype, ParseLinearStateDtype(o->linear_state_dtype));
  ASSIGN_OR_RETURN(o->batches, ParseIdList(o->batch));
  ASSIGN_OR_RETURN(o->contexts, ParseIdList(o->context));
  auto positive = [](const std::vector<int32_t>& v) {
    return !v.empty() && std::all_of(v.begin(), v.end(), [](int32_t x) { return x > 0; });
  };
  if (!positive(o->batches) || !positive(o->contexts) || o->steps < 1 || o->layers < 0)
    return InvalidArgument("--batch, --context and --steps must be positive, --layers not negative");
  if (o->decode_rows < 0 || o->decode_rows > 65536 || o->decode_context < 1 ||
      o->decode_context > (1 << 24))
    return InvalidArgument("--decode-rows must be in [0, 65536] and --decode-context in [1, 2^24]");
  return Status::Ok();
}

void DecodeOne(const BenchOptions& o, Loaded& l, DeviceTimer& timer, double copy_bw, int num_seqs, int ctx);
void PrefillOne(const BenchOptions& o, Loaded& l, DeviceTimer& timer, double peak, int num_seqs, int len);

// The time of each op kind in one call of `step`, summed over layers. On CUDA with `graph`, the
// step is captured with an event node before each op and replayed, so the intervals are device
// time without host launch gaps (the event nodes themselves add a little to the total);
// otherwise each op is timed eagerly (CUDA: events, host gaps included; CPU: host clock).
void PrintBreakdown(Loaded& l, bool graph, double step_ms, const std::function<void()>& step) {
  Backend& device = *l.device;
  std::unique_ptr<OpClock> clock;
#ifdef COROLLA_HAVE_CUDA
  clock = cuda::MakeEventOpClock(device);
#endif
  const bool events = clock != nullptr;
  if (!clock) clock = MakeHostOpClock(device);
  std::vector<std::string> labels;
  l.profiler->StartRecording(clock.get());  // eager: creates the clock's events before any capture
  step();
  labels = l.profiler->StopRecording();
  std::vector<double> ms = clock->IntervalsMs();
  const char* how = events ? "eager, CUDA events (host launch gaps included)" : "host clock";
#ifdef COROLLA_HAVE_CUDA
  if (graph && events) {
    std::string error;
    std::unique_ptr<cuda::StreamGraph> g = cuda::StreamGraph::Capture(
        device,
        [&] {
          l.profiler->StartRecording(clock.get());
          step();
          labels = l.profiler->StopRecording();
        },
        &error);
    if (g) {
      for (int i = 0; i < 3; ++i) g->Replay();
      device.Synchronize();
      g->Replay();  // the intervals are this replay's
      ms = clock->IntervalsMs();
      how = "one CUDA graph replay with an event node before each op";
    } else {
      std::printf("  breakdown: graph capture failed (%s); eager times instead\n", error.c_str());
    }
  }
#endif
  double total = 0;
  for (double t : ms) total += t;
  std::printf("  per-op breakdown (%s): %.3f ms summed over %zu ops; the step alone: %.3f ms\n", how, total,
              ms.size(), step_ms);
  std::printf("    %-34s %6s %10s %7s %10s\n", "op", "calls", "total ms", "share", "us/call");
  for (const OpTime& row : AggregateOpTimes(labels, ms))
    std::printf("    %-34s %6d %10.3f %6.1f%% %10.2f\n", row.label.c_str(), row.calls, row.total_ms,
                100.0 * row.total_ms / total, 1e3 * row.total_ms / row.calls);
}

#ifdef COROLLA_HAVE_CUDA
// Median of `steps` replays of `step` captured as one CUDA graph (the forward has no host
// synchronisation; every buffer it allocates comes back from the allocator's cache at the same
// address); -1 with *error set when the capture fails.
double GraphStepMs(Backend& device, DeviceTimer& timer, int steps, const std::function<void()>& step,
                   std::string* error) {
  std::unique_ptr<cuda::StreamGraph> g = cuda::StreamGraph::Capture(device, step, error);
  if (!g) return -1.0;
  g->Replay();
  device.Synchronize();
  return timer.Median(steps, [&] { g->Replay(); });
}
#endif

// The step time without each op kind of one step in turn (its marginal cost: overlaps with its
// neighbours included), timed as the step itself was (graph replays where they ran, else eager),
// --skip-op's labels skipped throughout.
void PrintMarginalCosts(Loaded& l, DeviceTimer& timer, int steps, bool graph, double step_ms,
                        const std::function<void()>& step) {
  Backend& device = *l.device;
  std::unique_ptr<OpClock> clock = MakeHostOpClock(device);
  l.skipper->StartRecording(clock.get());
  step();
  const std::vector<std::string> recorded = l.skipper->StopRecording();
  std::vector<std::string> labels;  // distinct, in order of first call
  std::vector<int> calls;
  for (const std::string& label : recorded) {
    if (label.ends_with(ProfilingBackend::kDeclined)) continue;
    const auto it = std::find(labels.begin(), labels.end(), label);
    if (it == labels.end()) {
      labels.push_back(label);
      calls.push_back(1);
    } else {
      ++calls[it - labels.begin()];
    }
  }
  auto time_step = [&]() -> double {
#ifdef COROLLA_HAVE_CUDA
    std::string error;
    if (graph && timer.events()) return GraphStepMs(device, timer, steps, step, &error);
#endif
    step();
    device.Synchronize();
    return timer.Median(steps, step);
  };
  std::printf("  marginal cost of each op kind (the step without it, %s): the step %.3f ms\n",
              graph && timer.events() ? "graph replays" : "eager", step_ms);
  std::printf("    %-34s %6s %12s %12s %10s\n", "op", "calls", "without ms", "marginal ms", "us/call");
  for (size_t i = 0; i < labels.size(); ++i) {
    std::vector<std::string> skip = l.skip;
    skip.push_back(labels[i]);
    l.skipper->SkipOps(skip);
    const double ms = time_step();
    if (ms < 0)
      std::printf("    %-34s %6d  (graph capture failed)\n", labels[i].c_str(), calls[i]);
    else
      std::printf("    %-34s %6d %12.3f %12.3f %10.2f\n", labels[i].c_str(), calls[i], ms, step_ms - ms,
                  1e3 * (step_ms - ms) / calls[i]);
  }
  l.skipper->SkipOps(l.skip);
}

Status BenchDecode(int argc, char** argv, bool* help) {
  BenchOptions o;
  RETURN_IF_ERROR(ParseOptions("decode", "time one decode step of B sequences at context L", argc, argv, &o, help));
  if (*help) return Status::Ok();
  if (std::optional<int> rc = SpawnLocalRanks(static_cast<int>(o.tp * o.dp), argc, argv))
    return *rc == 0 ? Status::Ok() : Internal("a rank exited with code " + std::to_string(*rc));
  ASSIGN_OR_RETURN(Loaded l, Load(o));
  DeviceTimer timer(*l.device);
  const double copy_bw = MeasureCopyBandwidth(*l.device, timer);
  for (int ctx : o.contexts)
    for (int num_seqs : o.batches) DecodeOne(o, l, timer, copy_bw, num_seqs, ctx);
  return Status::Ok();
}

void DecodeOne(const BenchOptions& o, Loaded& l, DeviceTimer& timer, double copy_bw, int num_seqs, int ctx) {
  if (!StepFits(l, "decode", num_seqs, ctx, 1)) return;
  Backend& backend = *l.device;
  Model& model = *l.model;
  const ModelConfig& c = model.config();
  // DP ranks decode different tokens (so they route to different experts).
  StepBatch s =
      MakeStepBatch(backend, model, std::vector<SeqShape>(num_seqs, {ctx - 1, 1}),
                    static_cast<uint64_t>(o.seed) + 7919 * l.shard.dp_rank, o.state_dtype);
  // The kernels take max_seq_len as an upper bound of the lengths (their splits past them empty).
  // --plan-bucket: the engine's plan (DecodeGraphs), its bucket stopped at the model's length.
  if (o.plan_bucket)
    s.batch.attention.max_seq_len =
        std::min(DecodeGraphs::ContextBucket(ctx),
                 DecodeGraphs::MaxBlocksPerSeq(c.max_position_embeddings, s.kv->block_size(),
                                               s.kv->num_blocks()) *
                     s.kv->block_size());
  auto step = [&] { model.Forward(s.batch, s.kv->views(), s.logits); };
  // DP-EP exchanges sized per layer read the sizes on the host, which a graph cannot capture.
  const bool dp_ep = l.shard.dp_ep(), graph = o.graph && !(l.shard.uses_ep_exchange() && l.shard.ep_capacity == 0);
  for (int i = 0; i < 3; ++i) step();  // warm-up: allocator cache, cuBLASLt plans
  backend.Synchronize();
  const double eager_ms = timer.Median(static_cast<int>(o.steps), step);
  double graph_ms = 0;
#ifdef COROLLA_HAVE_CUDA
  if (graph && timer.events()) {
    std::string error;
    graph_ms = GraphStepMs(backend, timer, static_cast<int>(o.steps), step, &error);
    if (graph_ms < 0) {
      graph_ms = 0;
      std::printf("  cuda graph capture failed: %s (eager numbers only)\n", error.c_str());
    }
  }
#endif

  const Result<bool> native_fp8 = NativeFp8Requested(backend);
  const ModelBytes mb = CountBytes(c, o.state_dtype, c.quant.method == "fp8" && native_fp8.ok() && *native_fp8);
  // Distinct experts a step reads per MoE layer, expected under uniform routing of B tokens
  // (DP-EP: of all ranks' tokens, over this rank's share of the experts).
  const double e = c.num_experts, k = c.num_experts_per_token;
  const double routed = dp_ep ? static_cast<double>(num_seqs) * l.shard.dp_size : num_seqs;
  const double distinct = mb.moe_layers ? e * (1.0 - std::pow(1.0 - k / e, routed)) / (dp_ep ? l.shard.ep_size : 1) : 0.0;
  // Under TP each rank reads its share of the attention and dense weights, of the KV (heads; not
  // below one KV head each) and of the experts; the LM head and embedding rows are whole.
  const int tp = l.shard.tp_size;
  const double kv_split = std::min<double>(tp, std::max(1, c.num_kv_heads));
  const double weight_bytes = mb.dense_per_layer_total / tp +
                              mb.moe_layers * (mb.router + distinct * mb.expert / (tp > 1 && !dp_ep ? l.shard.ep_size : 1)) +
                              mb.lm_head + 2.0 * c.hidden_size * num_seqs;
  const double kv_bytes = (mb.kv_per_token_all_layers * num_seqs * ctx + mb.state_per_seq * num_seqs) / kv_split;
  const double bytes = weight_bytes + kv_bytes;
  std::printf(
      "decode: %s, %d layers, batch %d, context %d, %s%s%s\n", c.model_type.c_str(), c.num_layers,
      num_seqs, ctx, backend.name().c_str(),
      c.num_linear_layers() > 0 && o.state_dtype == DType::kBF16 ? ", bf16 linear state" : "",
      o.plan_bucket
          ? (", planned on " + std::to_string(s.batch.attention.max_seq_len) + " keys").c_str()
          : "");
  if (tp > 1)
    std::printf("  tp %d (%s): the batch on every rank%s; per-rank bytes (norms and the LM head whole) and times "
                "below\n",
                tp, dp_ep ? "inside each DP replica" : "experts over the same ranks",
                dp_ep ? " of a replica, each dispatching 1/tp of it" : "");
  if (l.shard.dp_size > 1)
    std::printf("  dp %d x ep %d: batch %d on each rank, %d in all; experts %s; per-rank bytes and times below\n",
                l.shard.dp_size, l.shard.ep_size, num_seqs, num_seqs * l.shard.dp_size,
                !dp_ep                    ? "replicated"
                : l.shard.ep_capacity > 0 ? "split, fixed-size exchange (NVLink on CUDA unless COROLLA_EP_EXCHANGE)"
                                          : "split, all-to-all sized per layer");
  std::printf("  limit   memory copy bandwidth (%s, read + write): %.2f TB/s\n",
              backend.device() == Device::kCuda ? "4 GiB device to device" : "256 MiB on the host", copy_bw / 1e12);
  std::printf("  bytes a step must read: %.3f GB (weights %.3f GB with %.1f distinct experts/layer expected, KV + states %.3f GB)\n",
              bytes / 1e9, weight_bytes / 1e9, distinct, kv_bytes / 1e9);
  std::printf("  floor at the copy bandwidth: %.3f ms/step\n", bytes / copy_bw * 1e3);
  auto report = [&](const char* how, double ms) {
    const double bw = bytes / (ms * 1e-3);
    std::printf("  %-6s %.3f ms/step, %.1f tokens/s, %.2f TB/s = %.1f%% of the copy bandwidth\n", how, ms,
                num_seqs / (ms * 1e-3), bw / 1e12, 100.0 * bw / copy_bw);
    if (l.shard.dp_size > 1)
      std::printf("         aggregate over %d ranks: %.1f tokens/s\n", l.shard.dp_size,
                  static_cast<double>(num_seqs) * l.shard.dp_size / (ms * 1e-3));
  };
  report(timer.events() ? "eager" : "host", eager_ms);
  if (graph_ms > 0) report("graph", graph_ms);
  if (l.profiler) PrintBreakdown(l, graph, graph_ms > 0 ? graph_ms : eager_ms, step);
  if (o.marginal)
    PrintMarginalCosts(l, timer, static_cast<int>(o.steps), graph_ms > 0, graph_ms > 0 ? graph_ms : eager_ms, step);
  std::fflush(stdout);  // each combination's lines out before the next one runs
}

Status BenchPrefill(int argc, char** argv, bool* help) {
  BenchOptions o;
  o.steps = 5;
  RETURN_IF_ERROR(ParseOptions("prefill", "time one prefill of B prompts of L tokens", argc, argv, &o, help));
  if (*help) return Status::Ok();
  ASSIGN_OR_RETURN(Loaded l, Load(o));
  DeviceTimer timer(*l.device);
  const double peak = MeasureMatmulPeak(*l.device, timer);
  for (int len : o.contexts)
    for (int num_seqs : o.batches) PrefillOne(o, l, timer, peak, num_seqs, len);
  return Status::Ok();
}

void PrefillOne(const BenchOptions& o, Loaded& l, DeviceTimer& timer, double peak, int num_seqs, int len) {
  const int rows = static_cast<int>(o.decode_rows), dctx = static_cast<int>(o.decode_context);
  const int all = num_seqs + rows;
  if (!StepFits(l, "prefill", all, std::max(len, dctx),
                static_cast<int>((int64_t{num_seqs} * len + rows + all - 1) / all)))
    return;
  Backend& backend = *l.device;
  Model& model = *l.model;
  const ModelConfig& c = model.config();
  // The decodes first, as the engine schedules them.
  std::vector<SeqShape> shapes(rows, SeqShape{dctx - 1, 1});
  shapes.insert(shapes.end(), num_seqs, SeqShape{0, len});
  StepBatch s = MakeStepBatch(backend, model, shapes, static_cast<uint64_t>(o.seed), o.state_dtype);
  auto step = [&] { model.Forward(s.batch, s.kv->views(), s.logits); };
  step();
  backend.Synchronize();
  const double ms = timer.Median(static_cast<int>(o.steps), step);
  const double tokens = static_cast<double>(num_seqs) * len + rows;
  const double attn_flops =
      4.0 * c.num_attention_heads * c.head_dim * c.num_layers *
      (static_cast<double>(len) * (len + 1) / 2 * num_seqs + static_cast<double>(dctx) * rows);
  const double flops =
      FlopsPerToken(c) * tokens + attn_flops + 2.0 * c.vocab_size * c.hidden_size * all;
  const double rate = flops / (ms * 1e-3);
  std::printf("prefill: %s, %d layers, %d x %d tokens", c.model_type.c_str(), c.num_layers,
              num_seqs, len);
  if (rows > 0) std::printf(" + %d decode rows at context %d", rows, dctx);
  std::printf(", %s\n", backend.name().c_str());
  std::printf("  limit   matmul (%s GEMM through Linear): %.1f TFLOP/s\n",
              backend.device() == Device::kCpu ? "1024^3 f32" : "8192^3 bf16", peak / 1e12);
  std::printf("  FLOPs: %.3f TFLOP (%.3f of them attention scores)\n", flops / 1e12, attn_flops / 1e12);
  std::printf("  %.3f ms, %.0f tokens/s, %.1f TFLOP/s = %.1f%% of the matmul peak\n", ms, tokens / (ms * 1e-3),
              rate / 1e12, 100.0 * rate / peak);
  if (l.profiler) PrintBreakdown(l, /*graph=*/false, ms, step);
  if (l.observer) {  // one more step, its routing recorded
    ExpertLoad load;
    l.observer->ObserveExpertIds(
        [&](const TensorView& ids, int experts) { load.Record(backend, ids, experts); });
    step();
    l.observer->ObserveExpertIds({});
    std::printf("%s", load.Summary().c_str());
  }
  std::fflush(stdout);
}

}  // namespace

int BenchDecodeMain(int argc, char** argv) {
  bool help = false;
  return ReportStatus("bench decode", BenchDecode(argc, argv, &help));
}

int BenchPrefillMain(int argc, char** argv) {
  bool help = false;
  return ReportStatus("bench prefill", BenchPrefill(argc, argv, &help));
}

}  // namespace corolla::cli
