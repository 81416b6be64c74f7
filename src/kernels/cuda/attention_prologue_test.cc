// Qwen3's attention prologue on the GPU: the QkNormRopeKvWrite kernel (attention_prologue.cu)
// against the CPU backend's four ops, and QkNormRopeAttention, the prologue folded into the
// small-batch decode attention (attention_decode.cu), against the CPU backend's prologue +
// attention and against the same GPU's unfused pair.
// Needs a GPU; skips otherwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/test_util.h"

namespace corolla::cuda_test {
namespace {

// Strided views q [T, Hq, D], k, v [T, Hk, D] into one [T, q | k | v] row, as Qwen3's forward
// has them (q heads 2D apart when an output gate sits between them).
std::array<TensorView, 3> QkvViews(const Tensor& row, int64_t t, int64_t hq, int64_t hk, int64_t d, bool gate) {
  const int64_t q_cols = hq * d * (gate ? 2 : 1), width = q_cols + 2 * hk * d;
  auto heads = [&](int64_t first, int64_t n, int64_t stride) {
    TensorView v = row.view();
    v.data = static_cast<char*>(v.data) + first * DTypeSize(row.dtype());
    v.shape = {t, n, d};
    v.strides = {width, stride, 1, 0};
    return v;
  };
  return {heads(0, hq, gate ? 2 * d : d), heads(q_cols, hk, d), heads(q_cols + hk * d, hk, d)};
}

}  // namespace

// The fused prologue (attention_prologue.cu) against the CPU backend's four ops, on q/k/v laid
// out as Qwen3's forward has them: strided views into one [T, q | k | v] row (q heads 2D apart
// when an output gate sits between them), norm weights in f32 and bf16, scattered cache slots;
// with Tuning().prologue_early_loads, and with 4 heads a warp instead of a warp per token (64+
// tokens), the same bits.
TEST_F(CudaKernelTest, QkNormRopeKvWrite) {
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  struct Case { int64_t tokens, hq, hk, d; bool gate; DType w; };
  for (Case c : {Case{1, 32, 4, 128, false, DType::kF32}, Case{7, 8, 8, 64, false, DType::kBF16},
                 Case{130, 16, 2, 128, true, DType::kF32}, Case{5, 4, 2, 256, false, DType::kBF16},
                 Case{33, 32, 4, 128, false, DType::kBF16},
                 // 64+ tokens: a warp per token, or 4 heads a warp (a warp of only v heads; one of k
                 // and v heads; D 256; 7 heads: a last group of q, k and v past the heads)
                 Case{100, 8, 8, 64, false, DType::kF32}, Case{70, 4, 2, 256, false, DType::kBF16},
                 Case{65, 5, 1, 128, false, DType::kBF16}}) {
    const int64_t t = c.tokens, d = c.d, q_cols = c.hq * d * (c.gate ? 2 : 1), width = q_cols + 2 * c.hk * d;
    const int bs = 16, blocks = static_cast<int>((t + bs - 1) / bs) + 2;
    auto qkv = RandomBf16(t * width, 2.f);
    auto qw = RandomBf16(d, 1.f), kw = RandomBf16(d, 1.f);
    auto kc = RandomBf16(int64_t{blocks} * c.hk * bs * d), vc = RandomBf16(int64_t{blocks} * c.hk * bs * d);
    std::vector<int32_t> pos(t), slots(t);
    for (int64_t i = 0; i < t; ++i) {
      pos[i] = static_cast<int32_t>(std::uniform_int_distribution<int>(0, 40000)(Rng()));
      // Distinct: the stride is a prime that does not divide the slot count.
      slots[i] = static_cast<int32_t>((i * ((blocks * bs) % 7 != 0 ? 7 : 11)) % (blocks * bs));
    }
    const Shape cshape{blocks, c.hk, bs, d};
    auto views = [&](const Tensor& row) { return QkvViews(row, t, c.hq, c.hk, d, c.gate); };
    const RopeParams rope{static_cast<int>(d), 1e6f};
    const std::string shape = "T" + std::to_string(t) + " Hq" + std::to_string(c.hq) + " Hk" + std::to_string(c.hk) +
                              " D" + std::to_string(d) + (c.gate ? " gate" : "") + (c.w == DType::kF32 ? " w-f32" : " w-bf16");
    // CPU: the four ops in f32.
    Tensor cqkv = HostF32(qkv, {t, width}), ckc = HostF32(kc, cshape), cvc = HostF32(vc, cshape);
    Tensor cqw = HostF32(qw, {d}), ckw = HostF32(kw, {d}), cpos = HostI32(pos, {t}), cslots = HostI32(slots, {t});
    AttentionBatch cb{Tensor(), Tensor(), Tensor(), cslots, 1, 1};
    auto [cq, ck, cv] = views(cqkv);
    cpu->QkNormRopeKvWrite(cq, ck, cv, cqw, ckw, 1e-6f, cpos, rope, KvCacheView{ckc, cvc}, cb);
    // GPU: the fused kernel, its slot, rotation and weights read after the wait and (Tuning().
    // prologue_early_loads) before it: the same bits either way.
    Tensor gqw = Upload(gpu(), qw, {d}, c.w), gkw = Upload(gpu(), kw, {d}, c.w);
    Tensor gpos = UploadI32(gpu(), pos, {t}), gslots = UploadI32(gpu(), slots, {t});
    AttentionBatch gb{Tensor(), Tensor(), Tensor(), gslots, 1, 1};
    auto run = [&](bool early_loads, bool per_token) {
      cuda::Tuning().prologue_early_loads = early_loads;
      cuda::Tuning().prologue_warp_per_token = per_token;
      cuda::Tuning().prologue_warp_per_token_min_tokens = 0;  // the warp a token from 64 tokens
      Tensor gqkv = Upload(gpu(), qkv, {t, width}, DType::kBF16), gkc = Upload(gpu(), kc, cshape, DType::kBF16);
      Tensor gvc = Upload(gpu(), vc, cshape, DType::kBF16);
      auto [gq, gk, gv] = views(gqkv);
      gpu().QkNormRopeKvWrite(gq, gk, gv, gqw, gkw, 1e-6f, gpos, rope, KvCacheView{gkc, gvc}, gb);
      cuda::Tuning() = DefaultTuning();
      return std::array<std::vector<float>, 3>{Download(gpu(), gqkv), Download(gpu(), gkc), Download(gpu(), gvc)};
    };
    const auto got = run(false, true), early = run(true, true), heads = run(false, false);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(early[i], got[i]) << shape << " early loads, output " << i;
      EXPECT_EQ(heads[i], got[i]) << shape << " 4 heads a warp instead of a warp per token, output " << i;
    }
    const double e_qkv = RelError(got[0], std::vector<float>(cqkv.ptr<float>(), cqkv.ptr<float>() + t * width));
    const int64_t cn = int64_t{blocks} * c.hk * bs * d;
    const double e_k = RelError(got[1], std::vector<float>(ckc.ptr<float>(), ckc.ptr<float>() + cn));
    const double e_v = RelError(got[2], std::vector<float>(cvc.ptr<float>(), cvc.ptr<float>() + cn));
    Record("QkNormRopeKvWrite.qkv", shape, e_qkv, kBf16Tol);
    Record("QkNormRopeKvWrite.k_cache", shape, e_k, kBf16Tol);
    Record("QkNormRopeKvWrite.v_cache", shape, e_v, 0);
    EXPECT_LT(e_qkv, kBf16Tol) << shape;
    EXPECT_LT(e_k, kBf16Tol) << shape;
    EXPECT_EQ(e_v, 0.0) << shape;
  }
}

// QkNormRopeAttention with the prologue folded into the decode attention (Tuning().
// attention_fused_prologue) against the CPU backend's prologue + attention (bf16 tolerance) and
// against the same GPU's unfused pair (QkNormRopeKvWrite, then Attention): the output and both
// caches must be the same bits, since the fused kernel normalises and rotates with the same
// NormRopeHead. The fused path leaves q in the qkv row as it was (the unfused one rotates it in
// place): that tells the fused kernel ran rather than a fallback. Each case with the cached-key
// prefetch (Tuning().attention_decode_prefetch) on and off, split-KV off / default / widest,
// then two CUDA-graph replays of the fused op with the output poisoned before each. Sequences
// of one token each, at prefixes around the 64-key pass edges, one key, 1k and 8k; groups 1 / 8 /
// 12 / 16; D 64 / 128 / 256; block sizes 1 / 5 / 16 / 64 with shuffled tables.
TEST_F(CudaKernelTest, QkNormRopeAttention) {
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  struct Case {
    int64_t hq, hk, d;
    bool gate;
    DType w;
    int bs;
    std::vector<int> prefixes;
  };
  const std::vector<Case> cases = {
      {32, 4, 128, false, DType::kF32, 16, {1023}},                 // Qwen3-30B-A3B, batch 1
      {32, 4, 128, false, DType::kBF16, 16, {0, 63, 64, 127, 8191}},  // one key, pass edges, 8k
      {16, 2, 128, true, DType::kF32, 5, {6, 99, 1000}},            // output gate between q heads
      {8, 8, 64, false, DType::kBF16, 1, {0, 300}},                 // group 1, D 64
      {16, 1, 256, false, DType::kF32, 16, {77, 2000}},             // group 16, D 256
      {12, 1, 128, false, DType::kBF16, 64, {500, 4095}},           // group 12
      {32, 4, 128, false, DType::kBF16, 16, {5, 900, 17, 1500, 63, 2047, 1, 333}},  // batch 8
  };
  for (const Case& c : cases) {
    const int64_t d = c.d, b = static_cast<int64_t>(c.prefixes.size()), t = b;
    const int64_t q_cols = c.hq * d * (c.gate ? 2 : 1), width = q_cols + 2 * c.hk * d;
    const int bs = c.bs;
    // Sequence i: prefix p cached keys, this step's token at position p (its slot in the table).
    std::vector<int32_t> qstart{0}, seq_lens, pos, slots;
    int max_blocks = 0, total_blocks = 0, max_len = 0;
    for (int p : c.prefixes) {
      seq_lens.push_back(p + 1);
      qstart.push_back(qstart.back() + 1);
      pos.push_back(p);
      max_blocks = std::max(max_blocks, (p + 1 + bs - 1) / bs);
      total_blocks += (p + 1 + bs - 1) / bs;
      max_len = std::max(max_len, p + 1);
    }
    const int blocks = total_blocks + 2;
    std::vector<int32_t> perm(blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), Rng());
    std::vector<int32_t> tables(static_cast<size_t>(b) * max_blocks, 0);
    int next = 0;
    for (int64_t i = 0; i < b; ++i) {
      for (int j = 0; j < (seq_lens[i] + bs - 1) / bs; ++j) tables[i * max_blocks + j] = perm[next++];
      slots.push_back(tables[i * max_blocks + pos[i] / bs] * bs + pos[i] % bs);
    }
    auto qkv = RandomBf16(t * width, 2.f);
    auto qw = RandomBf16(d, 1.f), kw = RandomBf16(d, 1.f);
    const Shape cshape{blocks, c.hk, bs, d};
    const int64_t cn = int64_t{blocks} * c.hk * bs * d;
    auto kc = RandomBf16(cn), vc = RandomBf16(cn);
    const RopeParams rope{static_cast<int>(d), 1e6f};
    const float scale = 1.f / std::sqrt(static_cast<float>(d));
    std::string shape = "Hq" + std::to_string(c.hq) + " Hk" + std::to_string(c.hk) + " D" + std::to_string(d) +
                        " bs" + std::to_string(bs) + (c.gate ? " gate" : "") +
                        (c.w == DType::kF32 ? " w-f32" : " w-bf16") + " prefixes[";
    for (size_t i = 0; i < c.prefixes.size(); ++i) shape += std::to_string(c.prefixes[i]) + (i + 1 < c.prefixes.size() ? "," : "]");

    // CPU: the prologue's four ops, then attention, in f32.
    Tensor cqkv = HostF32(qkv, {t, width}), ckc = HostF32(kc, cshape), cvc = HostF32(vc, cshape);
    Tensor cout = Tensor::Empty(DType::kF32, {t, c.hq, d});
    // The batch holds views: its tensors live in named variables for the whole case.
    Tensor cqs = HostI32(qstart, {b + 1}), csl = HostI32(seq_lens, {b}), ctab = HostI32(tables, {b, max_blocks});
    Tensor cslot = HostI32(slots, {t}), cpos = HostI32(pos, {t}), cqw = HostF32(qw, {d}), ckw = HostF32(kw, {d});
    AttentionBatch cb{cqs, csl, ctab, cslot, 1, max_len};
    {
      auto [cq, ck, cv] = QkvViews(cqkv, t, c.hq, c.hk, d, c.gate);
      cpu->QkNormRopeAttention(cq, ck, cv, cqw, ckw, 1e-6f, cpos, rope, KvCacheView{ckc, cvc}, cb, scale, cout);
    }
    const std::vector<float> ref(cout.ptr<float>(), cout.ptr<float>() + t * c.hq * d);

    Tensor gqw = Upload(gpu(), qw, {d}, c.w), gkw = Upload(gpu(), kw, {d}, c.w), gpos = UploadI32(gpu(), pos, {t});
    Tensor gqs = UploadI32(gpu(), qstart, {b + 1}), gsl = UploadI32(gpu(), seq_lens, {b});
    Tensor gtab = UploadI32(gpu(), tables, {b, max_blocks}), gslot = UploadI32(gpu(), slots, {t});
    AttentionBatch gb{gqs, gsl, gtab, gslot, 1, max_len};
    struct Run {
      std::vector<float> out, k_cache, v_cache, qkv;
    };
    // One run of the op on fresh copies of the inputs; graph: captured once, replayed twice.
    auto run = [&](bool fused, bool prefetch, int min_ctas, bool graph, bool cluster = false) {
      cuda::Tuning().attention_fused_prologue = fused;
      cuda::Tuning().attention_fused_prologue_min_keys = 0;  // `fused` alone decides, at 8k too
      cuda::Tuning().attention_decode_cluster_merge_seqs = cluster ? 1 << 20 : 0;
      cuda::Tuning().attention_decode_prefetch = prefetch;
      cuda::Tuning().attention_split_min_ctas = min_ctas;
      Tensor gqkv = Upload(gpu(), qkv, {t, width}, DType::kBF16);
      Tensor gkc = Upload(gpu(), kc, cshape, DType::kBF16), gvc = Upload(gpu(), vc, cshape, DType::kBF16);
      Tensor gout = gpu().Empty(DType::kBF16, {t, c.hq, d});
      Poison(gpu(), gout);
      auto [gq, gk, gv] = QkvViews(gqkv, t, c.hq, c.hk, d, c.gate);
      auto op = [&] {
        gpu().QkNormRopeAttention(gq, gk, gv, gqw, gkw, 1e-6f, gpos, rope, KvCacheView{gkc, gvc}, gb, scale, gout);
      };
      if (!graph) {
        op();
      } else {
        auto captured = gpu().CaptureGraph(op);
        EXPECT_TRUE(captured.ok()) << captured.status().ToString();
        if (captured.ok())
          for (int replay = 0; replay < 2; ++replay) {
            Poison(gpu(), gout);
            captured.value()->Replay();
          }
      }
      Run r{Download(gpu(), gout), Download(gpu(), gkc), Download(gpu(), gvc), Download(gpu(), gqkv)};
      cuda::Tuning() = DefaultTuning();
      return r;
    };
    // The qkv row as the GPU holds it before any run (bf16).
    const std::vector<float> raw = Download(gpu(), Upload(gpu(), qkv, {t, width}, DType::kBF16));
    const int def = DefaultTuning().attention_split_min_ctas;
    for (int min_ctas : {0, def, 1 << 20}) {
      const Run unfused_plain = run(false, true, min_ctas, false);
      const double e_unfused = RelError(unfused_plain.out, ref);
      EXPECT_LT(e_unfused, kBf16Tol) << shape << " unfused";
      // With the cluster merge (Tuning().attention_decode_cluster_merge_seqs) on both sides.
      const Run unfused_cluster = run(false, true, min_ctas, false, true);
      EXPECT_LT(RelError(unfused_cluster.out, ref), kBf16Tol) << shape << " unfused, cluster merge";
      double worst = 0;
      for (int variant = 0; variant < 4; ++variant) {  // prefetch on, off, on in a graph, + cluster merge
        const bool prefetch = variant != 1, graph = variant >= 2, cluster = variant == 3;
        const Run fused = run(true, prefetch, min_ctas, graph, cluster);
        const Run& unfused = cluster ? unfused_cluster : unfused_plain;
        const std::string name = shape + " min_ctas " + std::to_string(min_ctas) + (prefetch ? "" : " noprefetch") +
                                 (graph ? " graph" : "") + (cluster ? " clustermerge" : "");
        const double e = RelError(fused.out, ref);
        worst = std::max(worst, e);
        EXPECT_LT(e, kBf16Tol) << name;
        EXPECT_TRUE(fused.out == unfused.out) << name << ": fused output differs from the unfused pair";
        EXPECT_TRUE(fused.k_cache == unfused.k_cache) << name << ": k cache differs";
        EXPECT_TRUE(fused.v_cache == unfused.v_cache) << name << ": v cache differs";
        // q as it was in the fused run (the fallback would have rotated it), k and v as well.
        EXPECT_TRUE(fused.qkv == raw) << name << ": the qkv row changed (did the fused kernel run?)";
        EXPECT_FALSE(unfused.qkv == raw) << name << ": the unfused prologue left q as it was";
      }
      Record("QkNormRopeAttention", shape + " min_ctas " + std::to_string(min_ctas), worst, kBf16Tol);
    }
  }
}

// Backend::QkNormRopeAttentionProj with Tuning().attention_region: the prologue, the decode
// attention and the o projection in one launch (one token) against the same GPU's ops run apart
// (the prologue kernel, the attention, Linear): the attention's output and the cache rows the
// same bits, the projection within a bf16 unit (the same bits where the staged GEMV takes a row
// a warp, as at Qwen3-30B-A3B's 2048 x 4096 on 132 SMs); eager three times on fresh inputs (the
// counters re-arm) and replayed in a graph. The case the fold does not take (group 16) must give
// the same results through the fallback. A bucket's hint (max_seq_len past the sequence, as
// under graph replay) leaves splits empty.
TEST_F(CudaKernelTest, QkNormRopeAttentionProj) {
  struct Case {
    int64_t hq, hk, d, n;
    int bs, prefix;
    bool folds;      // the one-launch kernel applies (group <= 8)
    int bucket = 0;  // the batch's max_seq_len hint (0: the sequence's length)
  };
  const std::vector<Case> cases = {
      {32, 4, 128, 2048, 16, 1023, true},  // Qwen3-30B-A3B, ctx 1024: 16 splits, the cluster merge
      {32, 4, 128, 2048, 16, 8191, true},  // ctx 8192: 64 splits, the counter merge
      {32, 4, 128, 2048, 16, 2047, true},  // ctx 2048: a cluster's 16 splits, prologue apart
      {32, 4, 128, 2048, 16, 200, true},   // 4 splits, pass edges inside
      {16, 2, 128, 1000, 5, 1000, true},   // rows not a multiple of anything, odd block size
      {8, 8, 64, 300, 16, 511, true},      // group 1, D 64
      {32, 4, 128, 2048, 16, 40, true},    // one split: no merge
      {16, 1, 256, 512, 16, 2000, false},  // group 16: the fallback
      {32, 4, 128, 2048, 16, 300, true, 1024},  // 16 splits planned, 11 of them empty
  };
  const int64_t launches0 = cuda::AttentionRegionLaunches();
  for (const Case& c : cases) {
    const int64_t d = c.d, width = (c.hq + 2 * c.hk) * d, k = c.hq * d;
    const int bs = c.bs, len = c.prefix + 1, nblocks = (len + bs - 1) / bs + 2;
    std::vector<int32_t> perm(nblocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), Rng());
    std::vector<int32_t> table(perm.begin(), perm.begin() + (len + bs - 1) / bs);
    const std::vector<int32_t> qstart{0, 1}, seq_lens{len}, pos{c.prefix},
        slots{table[c.prefix / bs] * bs + c.prefix % bs};
    const Shape cshape{nblocks, c.hk, bs, d};
    const int64_t cn = int64_t{nblocks} * c.hk * bs * d;
    auto qkv = RandomBf16(width, 2.f), qw = RandomBf16(d, 1.f), kw = RandomBf16(d, 1.f);
    auto kc = RandomBf16(cn), vc = RandomBf16(cn), wo = RandomBf16(c.n * k, 0.05f);
    const RopeParams rope{static_cast<int>(d), 1e6f};
    const float scale = 1.f / std::sqrt(static_cast<float>(d));
    const std::string shape = "Hq" + std::to_string(c.hq) + " Hk" + std::to_string(c.hk) + " D" + std::to_string(d) +
                              " N" + std::to_string(c.n) + " bs" + std::to_string(bs) + " prefix " +
                              std::to_string(c.prefix);
    Tensor gqw = Upload(gpu(), qw, {d}, DType::kBF16), gkw = Upload(gpu(), kw, {d}, DType::kBF16);
    Tensor gpos = UploadI32(gpu(), pos, {1}), gqs = UploadI32(gpu(), qstart, {2}), gsl = UploadI32(gpu(), seq_lens, {1});
    Tensor gtab = UploadI32(gpu(), table, {1, static_cast<int64_t>(table.size())}), gslot = UploadI32(gpu(), slots, {1});
    Tensor gwo = Upload(gpu(), wo, {c.n, k}, DType::kBF16);
    AttentionBatch gb{gqs, gsl, gtab, gslot, 1, c.bucket > 0 ? c.bucket : len};
    struct Run {
      std::vector<float> attn, proj, k_cache, v_cache;
      int64_t beside = 0;     // staged GEMV launches beside a folded attention (the o projection's)
      int64_t clustered = 0;  // decode launches that merged their splits as one cluster
    };
    // fold: Tuning().attention_region (with the cluster merge); replays: 0 eager, else a graph;
    // late: Tuning().attention_region_late_copy. Both merge the splits alike (the wide merge off:
    // the fold merges by the counters where more splits than a cluster), so the attention's bits
    // are the same.
    auto run = [&](bool fold, int replays, bool late = false) {
      cuda::Tuning().attention_region = fold;
      cuda::Tuning().attention_region_late_copy = late;
      cuda::Tuning().attention_decode_cluster_merge_seqs = 1;
      cuda::Tuning().attention_decode_wide_merge = false;
      Tensor gqkv = Upload(gpu(), qkv, {1, width}, DType::kBF16), raw_qkv = Upload(gpu(), qkv, {1, width}, DType::kBF16);
      Tensor gkc = Upload(gpu(), kc, cshape, DType::kBF16), gvc = Upload(gpu(), vc, cshape, DType::kBF16);
      Tensor attn = gpu().Empty(DType::kBF16, {1, c.hq, d}), proj = gpu().Empty(DType::kBF16, {1, c.n});
      Poison(gpu(), attn);
      Poison(gpu(), proj);
      auto [gq, gk, gv] = QkvViews(gqkv, 1, c.hq, c.hk, d, false);
      auto op = [&] {
        gpu().QkNormRopeAttentionProj(gq, gk, gv, gqw, gkw, 1e-6f, gpos, rope, KvCacheView{gkc, gvc}, gb, scale, attn,
                                      gwo, proj);
      };
      const int64_t beside0 = cuda::StagedGemvBesideLaunches(),
                    clustered0 = cuda::AttentionDecodeClusterLaunches();
      if (replays == 0) {
        op();
      } else {
        auto captured = gpu().CaptureGraph(op);
        EXPECT_TRUE(captured.ok()) << captured.status().ToString();
        if (captured.ok())
          for (int replay = 0; replay < replays; ++replay) {
            Poison(gpu(), proj);
            // The fallback's prologue rotates q and k in place: every replay starts from the raw row.
            gpu().Copy(raw_qkv, gqkv);
            captured.value()->Replay();
          }
      }
      Run r{Download(gpu(), attn),
            Download(gpu(), proj),
            Download(gpu(), gkc),
            Download(gpu(), gvc),
            cuda::StagedGemvBesideLaunches() - beside0,
            cuda::AttentionDecodeClusterLaunches() - clustered0};
      cuda::Tuning() = DefaultTuning();
      return r;
    };
    const Run apart = run(false, 0);
    // Apart, one sequence of at least attention_fused_prologue_min_keys folds its prologue into the
    // attention: the o projection after it (the staged GEMV) then runs as the variant that keeps
    // its own carveout (SetStagedGemvBesideFoldedAttention), and its output is checked below.
    // Up to attention_decode_cluster_max_keys the splits stay one cluster and the prologue apart.
    const int min_keys = DefaultTuning().attention_fused_prologue_min_keys;
    const bool capped = len <= DefaultTuning().attention_decode_cluster_max_keys;
    EXPECT_EQ(apart.beside, min_keys > 0 && len >= min_keys && !capped ? 1 : 0)
        << shape << ": the o projection's variant";
    if (len > 1024 && capped && c.hq <= 8 * c.hk) {  // (group 16: the wide kernel, no cluster)
      EXPECT_EQ(apart.clustered, 1) << shape << ": the splits merge as one cluster";
    }
    // Eager three times, a graph replayed twice, then eager and a graph with the late copies.
    for (int variant = 0; variant < 6; ++variant) {
      const int64_t before = cuda::AttentionRegionLaunches();
      const bool eager = variant != 3 && variant != 5;
      const bool late = variant >= 4;
      const Run one = run(true, eager ? 0 : 2, late);
      const std::string name =
          shape + (eager ? " eager " + std::to_string(variant) : " graph") + (late ? " late copy" : "");
      if (eager) {  // (a graph's launches are counted at capture)
        EXPECT_EQ(cuda::AttentionRegionLaunches() > before, c.folds) << name << ": the fold ran or not";
      }
      EXPECT_TRUE(one.attn == apart.attn) << name << ": the attention's output differs";
      EXPECT_TRUE(one.k_cache == apart.k_cache) << name << ": k cache differs";
      EXPECT_TRUE(one.v_cache == apart.v_cache) << name << ": v cache differs";
      double worst = 0;
      for (int64_t i = 0; i < c.n; ++i) {
        const double diff = std::fabs(one.proj[i] - apart.proj[i]);
        worst = std::max(worst, diff / (std::fabs(apart.proj[i]) + 1e-2));
        EXPECT_LE(diff, std::fabs(apart.proj[i]) / 128 + 1e-3) << name << " row " << i;
        if (diff > std::fabs(apart.proj[i]) / 128 + 1e-3) break;
      }
      Record("QkNormRopeAttentionProj", name, worst, 1.0 / 128);
    }
  }
  EXPECT_GT(cuda::AttentionRegionLaunches(), launches0);
}

}  // namespace corolla::cuda_test
