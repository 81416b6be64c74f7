// KvWrite and Attention on the GPU against their CPU twins (cpu::KvWrite, cpu::Attention). Every
// case runs through every attention kernel (Tuning().attention_mma on: the tensor-core kernels
// where the shape allows, else SIMT: attention_wgmma.cu for Dk 128 / 192, Dv 128 prefill (more than
// 16 tokens a sequence) unless Tuning().attention_wgmma is off ("mma.sync" variants),
// attention_mma.cu otherwise; mma off: SIMT) and every split-KV setting (off, default, as wide as
// possible; with exact host hints and with loose ones, as under CUDA-graph replay where the host
// only knows upper bounds; split mma runs merge in the last split CTA and, again, through the
// separate merge kernel). The sweep: decode, prefill and chunked prefill with lengths and prefixes
// off the tiles, GQA groups 1/2/4/8 up to 64 query heads, head dims 32-256, block sizes 16, 5 and
// 1, MLA's shapes (SIMT; decode also through mla_decode.cu, whose own sweep is mla_decode_test.cc),
// a decode batch of 64 at 8k context. Fresh bf16-rounded random inputs, outputs NaN-poisoned before
// each run, ||out - ref|| / ||ref|| < kBf16Tol. The mma variants include every build of the wgmma kernel
// (Tuning().attention_wgmma_variant 0..5, "wgmma_variantN" in the names), each with the TMA
// producer (the default where the block size allows it) and with the cp.async one ("cpasync" in the
// names). CudaKernelTest.AttentionWgmmaTileProbe checks one wgmma S tile and one P V tile alone.
// Decode batches also run on the small-batch decode kernel (attention_decode.cu, "decode" variants:
// DecodeVariants), the "mma" ones on attention_mma.cu; CudaKernelTest.AttentionDecodeKernel sweeps
// it (with CUDA-graph replays). The kernels' speed: attention_perf_test.cc. Needs a GPU; skips
// otherwise.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <functional>
#include <numeric>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/split_keys.h"
#include "kernels/cuda/test_util.h"

namespace corolla::cuda_test {
namespace {

// One launch setting: which kernel, how split-KV plans, and whether the host hints (max_q_len,
// max_seq_len) are exact or only upper bounds.
struct AttnVariant {
  bool mma;
  int split_min_ctas;
  bool loose_hints;
  bool fused_merge = true;  // mma with splits: the last split CTA merges (else AttentionMergeKernel)
  bool wgmma = true;        // mma: D 128 prefill on attention_wgmma.cu (else attention_mma.cu)
  int wgmma_variant = 0;    // Tuning().attention_wgmma_variant (0 the base wgmma kernel)
  bool tma = true;          // Tuning().attention_wgmma_tma (false: the cp.async producer)
  // Tuning().attention_decode_kernel: decode (max_q_len 1) on attention_decode.cu; its loose
  // hints keep max_q_len exact (a looser one sends the batch to attention_mma.cu) and loosen
  // max_seq_len only. decode_split_keys: Tuning().attention_decode_split_keys.
  bool decode = false;
  int decode_split_keys = 64;
  int decode_merge_floats = 65536;  // Tuning().attention_decode_merge_floats
  bool decode_cluster = false;      // Tuning().attention_decode_cluster_merge_seqs: all
  bool decode_warm_merge = false;   // Tuning().attention_decode_warm_merge
  bool decode_wide = false;         // Tuning().attention_decode_wide_merge
  int Kernel() const { return decode ? 3 : !mma ? 0 : wgmma ? 1 : 2; }  // index of the per-kernel worst error
  std::string Name() const {
    return std::string(decode ? "decode" : !mma ? "simt" : wgmma ? "mma" : "mma.sync") +
           (decode && decode_split_keys != 64 ? " splitkeys" + std::to_string(decode_split_keys) : "") +
           (decode && decode_merge_floats != 65536 ? " mergefloats" + std::to_string(decode_merge_floats) : "") +
           (decode && decode_cluster ? " clustermerge" : "") + (decode && decode_warm_merge ? " warm" : "") +
           (decode && decode_wide ? " wide" : "") +
           (split_min_ctas == 0 ? " nosplit" : split_min_ctas == (1 << 20) ? " widesplit" : " split") +
           (loose_hints ? " loosehints" : "") + (fused_merge ? "" : " sepmerge") +
           (wgmma_variant != 0 ? " wgmma_variant" + std::to_string(wgmma_variant) : "") +
           (tma ? "" : " cpasync");
  }
};

std::vector<AttnVariant> DecodeVariants();

std::vector<AttnVariant> AttnVariants() {
  std::vector<AttnVariant> v;
  const int def = DefaultTuning().attention_split_min_ctas > 0 ? DefaultTuning().attention_split_min_ctas : 264;
  const std::pair<int, bool> splits[] = {{0, false}, {def, false}, {def, true}, {1 << 20, false}, {1 << 20, true}};
  for (bool mma : {false, true})
    for (auto [min_ctas, loose] : splits) {
      v.push_back({mma, min_ctas, loose, true});
      if (mma && min_ctas > 0) v.push_back({mma, min_ctas, loose, false});
    }
  // The mma.sync prefill kernel where the wgmma one would serve (the splits only apply at <= 16
  // tokens a sequence, where the wgmma kernel never runs).
  v.push_back({true, 0, false, true, false});
  v.push_back({true, def, true, true, false});
  // The other builds of the wgmma prefill kernel (Tuning().attention_wgmma_variant 1..5: grid
  // order, intra-warpgroup overlap, ping-pong, each overlap one with the fast softmax), exact
  // and loose hints.
  for (int wv = 1; wv < cuda::kAttentionWgmmaVariants; ++wv) {
    v.push_back({true, 0, false, true, true, wv});
    v.push_back({true, def, true, true, true, wv});
  }
  // Every build again with the cp.async producer (the runs above take TMA where the cache allows).
  for (int wv = 0; wv < cuda::kAttentionWgmmaVariants; ++wv) {
    v.push_back({true, 0, false, true, true, wv, false});
    v.push_back({true, def, true, true, true, wv, false});
  }
  for (AttnVariant d : DecodeVariants()) v.push_back(d);
  return v;
}

// The decode kernel (attention_decode.cu) under every split setting, fused and separate merge,
// exact and loose max_seq_len, 16-key splits (the most partials its plan allows).
std::vector<AttnVariant> DecodeVariants() {
  std::vector<AttnVariant> v;
  const int def = DefaultTuning().attention_split_min_ctas > 0 ? DefaultTuning().attention_split_min_ctas : 264;
  const std::pair<int, bool> splits[] = {{0, false}, {def, false}, {def, true}, {1 << 20, false}, {1 << 20, true}};
  for (auto [min_ctas, loose] : splits)
    for (bool fused : {true, false}) {
      if (min_ctas == 0 && !fused) continue;
      AttnVariant a{true, min_ctas, loose, fused};
      a.decode = true;
      v.push_back(a);
    }
  // The splits of a (sequence, KV head) as one cluster merging through shared memory (2-16
  // splits, groups <= 8; other plans fall back to the counter merge), and every split merging a
  // share once all have counted in (WideMergeDecode, where the grid fits the device at once).
  for (auto [min_ctas, loose] : splits) {
    if (min_ctas == 0) continue;
    AttnVariant a{true, min_ctas, loose, true};
    a.decode = true;
    a.decode_wide = true;
    v.push_back(a);
    a.decode_wide = false;
    a.decode_cluster = true;
    v.push_back(a);
    a.decode_warm_merge = true;  // the merge run dry first: the same output
    v.push_back(a);
  }
  // The wide merge with 16-key splits and more merge floats: as many splits as its loads allow.
  for (bool loose : {false, true}) {
    AttnVariant a{true, 1 << 20, loose, true};
    a.decode = true;
    a.decode_wide = true;
    a.decode_split_keys = 16;
    a.decode_merge_floats = 1 << 20;
    v.push_back(a);
  }
  for (bool loose : {false, true}) {
    AttnVariant a{true, 1 << 20, loose, true};
    a.decode = true;
    a.decode_split_keys = 16;
    v.push_back(a);
    a.decode_merge_floats = 1 << 20;  // the merge bounded only by its shared (m, l) rows
    v.push_back(a);
  }
  return v;
}

// Builds a paged cache holding random K/V for every sequence's prefix, then KvWrite of this
// step's tokens and Attention, on both backends.
struct AttnCase {
  int d, group;
  std::vector<int> q_lens, prefix_lens;
  int dv = 0;           // 0: d
  int hk = 2;           // KV heads
  bool shared = false;  // one cache tensor for K and V (MLA latent): V = first dv dims of K
  int block_size = 16;
  // NaN in every cache slot past its sequence's length (the tails of the last blocks, the spare
  // blocks): a kernel that lets a key past what a row sees reach its output (V times P = 0)
  // shows NaN.
  bool poison_tail = false;
  // Only the decode kernel's variants and the mma one at the default split (its sweep: the
  // decode tests), and each of them also captured in a CUDA graph and replayed twice, the
  // output poisoned before each replay (the fused merge's counters must re-arm).
  bool decode_only = false;
  bool graph_replay = false;
  // AttentionBatch::num_decode_seqs: the leading one-token sequences, which a mixed step's
  // attention may give to the decode kernel.
  int num_decode_seqs = 0;
};

void RunAttention(Backend& gpu, const AttnCase& c) {
  const int hk = c.hk, hq = hk * c.group, bs = c.block_size, d = c.d, dv = c.dv > 0 ? c.dv : c.d;
  const int num_seqs = static_cast<int>(c.q_lens.size());
  std::vector<int32_t> qstart{0}, seq_lens, slots, positions;
  int max_blocks = 0, total_blocks = 0, max_q = 0, max_len = 0;
  for (int b = 0; b < num_seqs; ++b) {
    int len = c.prefix_lens[b] + c.q_lens[b];
    seq_lens.push_back(len);
    qstart.push_back(qstart.back() + c.q_lens[b]);
    max_blocks = std::max(max_blocks, (len + bs - 1) / bs);
    total_blocks += (len + bs - 1) / bs;
    max_q = std::max(max_q, c.q_lens[b]);
    max_len = std::max(max_len, len);
  }
  const int num_blocks = total_blocks + 3;
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), Rng());  // scrambled physical blocks
  std::vector<int32_t> tables(static_cast<size_t>(num_seqs) * max_blocks, 0);
  int next = 0;
  for (int b = 0; b < num_seqs; ++b)
    for (int j = 0; j < (seq_lens[b] + bs - 1) / bs; ++j) tables[b * max_blocks + j] = perm[next++];
  for (int b = 0; b < num_seqs; ++b)
    for (int p = c.prefix_lens[b]; p < seq_lens[b]; ++p) {
      slots.push_back(tables[b * max_blocks + p / bs] * bs + p % bs);
      positions.push_back(p);
    }
  const int64_t tokens = qstart.back();
  const int64_t cache_n = int64_t{num_blocks} * hk * bs * d, vcache_n = int64_t{num_blocks} * hk * bs * dv;
  auto kc = RandomBf16(cache_n), vc = RandomBf16(vcache_n);
  if (c.poison_tail) {
    std::vector<bool> live(static_cast<size_t>(num_blocks) * bs, false);  // (block, slot) of a key
    for (int b = 0; b < num_seqs; ++b)
      for (int p = 0; p < seq_lens[b]; ++p) live[static_cast<size_t>(tables[b * max_blocks + p / bs]) * bs + p % bs] = true;
    for (int64_t blk = 0; blk < num_blocks; ++blk)
      for (int h = 0; h < hk; ++h)
        for (int slot = 0; slot < bs; ++slot) {
          if (live[blk * bs + slot]) continue;
          const int64_t row = (blk * hk + h) * bs + slot;
          std::fill_n(kc.begin() + row * d, d, NAN);
          std::fill_n(vc.begin() + row * dv, dv, NAN);
        }
  }
  auto q = RandomBf16(tokens * hq * d, 2.f), k = RandomBf16(tokens * hk * d, 2.f), v = RandomBf16(tokens * hk * dv);
  Shape cshape{num_blocks, hk, bs, d}, vshape{num_blocks, hk, bs, dv};

  Tensor ckc = HostF32(kc, cshape), cvc = HostF32(vc, vshape);
  Tensor cq = HostF32(q, {tokens, hq, d}), ck = HostF32(k, {tokens, hk, d}), cv = HostF32(v, {tokens, hk, dv});
  Tensor cqs = HostI32(qstart, {num_seqs + 1}), csl = HostI32(seq_lens, {num_seqs});
  Tensor ctab = HostI32(tables, {num_seqs, max_blocks}), cslot = HostI32(slots, {tokens});
  AttentionBatch cb{cqs, csl, ctab, cslot, max_q, max_len};
  KvCacheView ccache = c.shared ? KvCacheView{ckc, ckc} : KvCacheView{ckc, cvc};
  cpu::KvWrite(ck, c.shared ? ck.view() : cv.view(), ccache, cb);
  Tensor cout = Tensor::Empty(DType::kF32, {tokens, hq, dv});
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  cpu::Attention(cq, ccache, cb, scale, cout);
  const std::vector<float> ref(cout.ptr<float>(), cout.ptr<float>() + tokens * hq * dv);

  Tensor gkc = Upload(gpu, kc, cshape, DType::kBF16), gvc = Upload(gpu, vc, vshape, DType::kBF16);
  Tensor gq = Upload(gpu, q, {tokens, hq, d}, DType::kBF16), gk = Upload(gpu, k, {tokens, hk, d}, DType::kBF16);
  Tensor gv = Upload(gpu, v, {tokens, hk, dv}, DType::kBF16);
  Tensor gqs = UploadI32(gpu, qstart, {num_seqs + 1}), gsl = UploadI32(gpu, seq_lens, {num_seqs});
  Tensor gtab = UploadI32(gpu, tables, {num_seqs, max_blocks}), gslot = UploadI32(gpu, slots, {tokens});
  KvCacheView gcache = c.shared ? KvCacheView{gkc, gkc} : KvCacheView{gkc, gvc};
  gpu.KvWrite(gk, c.shared ? gk.view() : gv.view(), gcache, AttentionBatch{gqs, gsl, gtab, gslot, max_q, max_len});

  std::string shape = "D" + std::to_string(d) + (dv != d ? "/" + std::to_string(dv) : "") + " Hk" +
                      std::to_string(hk) + " g" + std::to_string(c.group) + (c.shared ? " latent" : "") +
                      (bs != 16 ? " bs" + std::to_string(bs) : "") + (c.poison_tail ? " nan-tail" : "") + " q[";
  for (int b = 0; b < std::min(num_seqs, 6); ++b)
    shape += std::to_string(c.q_lens[b]) + "+" + std::to_string(c.prefix_lens[b]) + (b + 1 < num_seqs ? "," : "]");
  if (num_seqs > 6) shape += "..x" + std::to_string(num_seqs) + "]";
  // The poisoned slots compare as equal where both caches hold NaN (RelError rejects NaN).
  auto cache_error = [](std::vector<float> got, std::vector<float> want) {
    for (size_t i = 0; i < got.size() && i < want.size(); ++i)
      if (std::isnan(got[i]) && std::isnan(want[i])) got[i] = want[i] = 0.f;
    return RelError(got, want);
  };
  double ek = cache_error(Download(gpu, gkc), std::vector<float>(ckc.ptr<float>(), ckc.ptr<float>() + cache_n));
  double ev = c.shared ? 0.0 : cache_error(Download(gpu, gvc), std::vector<float>(cvc.ptr<float>(), cvc.ptr<float>() + vcache_n));
  Record("KvWrite", shape, std::max(ek, ev), 0);
  EXPECT_EQ(ek, 0.0) << shape;
  EXPECT_EQ(ev, 0.0) << shape;

  const char* kernel = c.shared ? "Attention.mla_latent" : dv != d ? "Attention.dv<dk" : "Attention";
  double worst[4] = {0, 0, 0, 0};  // per kernel setting (simt, mma, mma.sync, decode), over the split settings
  std::vector<AttnVariant> variants = AttnVariants();
  if (c.decode_only) {
    variants = DecodeVariants();
    variants.push_back({true, DefaultTuning().attention_split_min_ctas, false, true});
  }
  for (const AttnVariant& var : variants) {
    if (var.decode && max_q != 1) continue;  // not a decode batch: the decode variants would repeat the mma ones
    cuda::Tuning().attention_mma = var.mma;
    cuda::Tuning().attention_split_min_ctas = var.split_min_ctas;
    cuda::Tuning().attention_fused_merge = var.fused_merge;
    cuda::Tuning().attention_wgmma = var.wgmma;
    cuda::Tuning().attention_wgmma_variant = var.wgmma_variant;
    cuda::Tuning().attention_wgmma_tma = var.tma;
    cuda::Tuning().attention_decode_kernel = var.decode;
    cuda::Tuning().attention_decode_split_keys = var.decode_split_keys;
    cuda::Tuning().attention_decode_merge_floats = var.decode_merge_floats;
    cuda::Tuning().attention_decode_cluster_merge_seqs = var.decode_cluster ? 1 << 20 : 0;
    cuda::Tuning().attention_decode_wide_merge = var.decode_wide;
    cuda::Tuning().attention_decode_warm_merge = var.decode_warm_merge;
    // Loose hints: a bigger max_q_len (more row tiles, maybe the other tile shape) and a context
    // bound past every sequence (more splits than the lengths need, some of them empty).
    AttentionBatch gb{gqs,
                      gsl,
                      gtab,
                      gslot,
                      var.loose_hints && !var.decode ? max_q + 5 : max_q,
                      var.loose_hints ? 2 * max_len + 37 : max_len,
                      c.num_decode_seqs};
    Tensor gout = gpu.Empty(DType::kBF16, {tokens, hq, dv});
    Poison(gpu, gout);
    gpu.Attention(gq, gcache, gb, scale, gout);
    const double e = RelError(Download(gpu, gout), ref);
    worst[var.Kernel()] = std::max(worst[var.Kernel()], e);
    EXPECT_LT(e, kBf16Tol) << shape << " " << var.Name();
    if (c.graph_replay) {
      auto graph = gpu.CaptureGraph([&] { gpu.Attention(gq, gcache, gb, scale, gout); });
      ASSERT_TRUE(graph.ok()) << graph.status().ToString();
      for (int replay = 0; replay < 2; ++replay) {
        Poison(gpu, gout);
        graph.value()->Replay();
        const double eg = RelError(Download(gpu, gout), ref);
        worst[var.Kernel()] = std::max(worst[var.Kernel()], eg);
        EXPECT_LT(eg, kBf16Tol) << shape << " " << var.Name() << " graph replay " << replay;
      }
    }
  }
  // Shapes outside the mma kernels' tables run SIMT under both settings: one row for them. MLA
  // latent decode with exact hints goes to mla_decode.cu (loose hints' max_q_len keeps it SIMT).
  const bool mla_decode = c.shared && c.hk == 1 && max_q == 1 && ((d == 576 && dv == 512) || (d == 48 && dv == 32));
  const bool mma_shape = (!c.shared && ((dv == d && (d == 32 || d == 64 || d == 128 || d == 256)) ||
                                        (d == 192 && dv == 128))) ||
                         mla_decode;
  // Dv 128 prefill at Dk 128 or 192: "mma" is the wgmma kernel (on sm_90), "mma.sync"
  // attention_mma.cu.
  const bool wgmma_shape =
      mma_shape && !c.shared && (d == 128 || d == 192) && dv == 128 && max_q > 16;
  const bool decode_shape = !c.shared && dv == d && (d == 64 || d == 128 || d == 256) && max_q == 1 && c.group <= 16;
  if (decode_shape) Record(kernel, shape + " decode" + (c.graph_replay ? " graph" : ""), worst[3], kBf16Tol);
  else worst[1] = std::max(worst[1], worst[3]);  // the decode variants ran the other kernels
  if (c.decode_only) {
    Record(kernel, shape + " mma", worst[1], kBf16Tol);
  } else if (wgmma_shape) {
    Record(kernel, shape + " simt", worst[0], kBf16Tol);
    Record(kernel, shape + " wgmma", worst[1], kBf16Tol);
    Record(kernel, shape + " mma.sync", worst[2], kBf16Tol);
  } else if (mma_shape) {  // "mma" and "mma.sync" variants ran the same kernels
    Record(kernel, shape + " simt", worst[0], kBf16Tol);
    Record(kernel, shape + " mma", std::max(worst[1], worst[2]), kBf16Tol);
  } else {
    Record(kernel, shape + " simt", std::max({worst[0], worst[1], worst[2]}), kBf16Tol);
  }
  cuda::Tuning() = DefaultTuning();
}

}  // namespace

// The split key ranges (host only): they tile [0, seq_len) in order, in whole align-key tiles;
// the longest is ceil(tiles / splits) tiles; equal chunks with the remainder last where those
// leave no split empty, else every split one tile within the others, none empty while
// tiles >= splits (a plan made for a longer bucket).
TEST(SplitKeyRange, TilesTheSequence) {
  for (int align : {1, 16, 32, 64})
    for (int splits = 2; splits <= 40; ++splits)
      for (int len = 1; len <= 9000; len += len < 600 ? 1 : 37) {
        const int tiles = (len + align - 1) / align, chunk = (tiles + splits - 1) / splits;
        const bool chunks_fit = chunk * (splits - 1) < tiles;
        int pos = 0, empties = 0;
        for (int s = 0; s < splits; ++s) {
          const cuda::KeyRange r = cuda::SplitKeyRange(len, splits, s, align, len);
          if (r.begin >= r.end) {
            ++empties;
            continue;
          }
          ASSERT_EQ(r.begin, pos) << "len " << len << " splits " << splits << " align " << align
                                  << " split " << s;
          ASSERT_EQ(r.begin % align, 0);
          ASSERT_LE(r.end - r.begin, chunk * align);
          if (chunks_fit && s < splits - 1) {
            ASSERT_EQ(r.end - r.begin, chunk * align);
          } else if (!chunks_fit && r.end < len) {
            ASSERT_GE(r.end - r.begin, (tiles / splits) * align);
          }
          pos = r.end;
        }
        ASSERT_EQ(pos, len) << "len " << len << " splits " << splits << " align " << align;
        if (tiles >= splits) {
          ASSERT_EQ(empties, 0) << "len " << len << " splits " << splits << " align " << align;
        }
      }
  // A limit clips the ranges (a causal prefill tile sees keys up to its last row's).
  const cuda::KeyRange r = cuda::SplitKeyRange(1000, 4, 3, 32, 900);
  EXPECT_EQ(r.end, 900);
  EXPECT_GE(cuda::SplitKeyRange(1000, 4, 3, 32, 700).begin, 700);  // empty: begin >= end
}

TEST_F(CudaKernelTest, KvWriteAndAttention) {
  for (int d : {32, 64, 128, 256})
    for (int group : {1, 2, 4, 8}) {
      RunAttention(gpu(), {d, group, {1, 1, 1}, {0, 16, 300}});           // decode
      RunAttention(gpu(), {d, group, {37, 100}, {0, 0}});                 // prefill
      RunAttention(gpu(), {d, group, {5, 64, 1}, {40, 129, 77}});         // chunked prefill + decode
      RunAttention(gpu(), {d, group, {1, 2, 1, 1}, {31, 65, 1000, 7}});   // decode, split edges
    }
  RunAttention(gpu(), {128, 8, {1}, {4095}});  // long decode
  // MLA: the absorbed form (one latent KV head of kv_lora + rope dims shared by K and V, many
  // query heads) and the decompressed form (per-head K of nope + rope dims, V of v dims).
  for (auto [dk, dv] : {std::pair{48, 32}, std::pair{576, 512}})
    for (int group : {4, 16, 128}) {
      RunAttention(gpu(), {dk, group, {1, 1, 1}, {0, 16, 300}, dv, 1, true});        // decode
      RunAttention(gpu(), {dk, group, {5, 64, 1}, {40, 129, 77}, dv, 1, true});      // chunks + decode
    }
  for (auto [dk, dv] : {std::pair{48, 32}, std::pair{192, 128}}) {
    RunAttention(gpu(), {dk, 1, {37, 100}, {0, 0}, dv, 4});             // prefill, 4 heads
    RunAttention(gpu(), {dk, 1, {5, 64, 1}, {40, 129, 77}, dv, 16});    // chunked
  }
  // DeepSeek's decompressed 192 / 128 on the tensor cores too: longer prompts, decode and the
  // split-KV edges (the split partials and their merge are Dv wide).
  RunAttention(gpu(), {192, 1, {300, 129}, {0, 0}, 128, 8});
  RunAttention(gpu(), {192, 1, {1, 1, 1}, {0, 16, 300}, 128, 16});
  RunAttention(gpu(), {192, 1, {1, 2, 1, 1}, {31, 65, 1000, 7}, 128, 4});
}

// Prefill lengths off the 64-row / 64-key tiles, chunks over prefixes off them, many heads.
TEST_F(CudaKernelTest, AttentionPrefillTiles) {
  for (int d : {64, 128}) {
    RunAttention(gpu(), {d, 4, {1000}, {0}});                          // 4000 rows, 16 key tiles
    RunAttention(gpu(), {d, 1, {129}, {0}});                           // one row past two tiles
    RunAttention(gpu(), {d, 8, {129, 3}, {0, 0}});
  }
  RunAttention(gpu(), {256, 2, {129}, {0}});
  // A mixed step (chunked prefill beside decodes): the leading one-token sequences on the decode
  // kernel, the prompts on wgmma, both writing one output; also each sequence where the hint
  // says none decode.
  for (int group : {1, 4, 8})
    for (int decodes : {0, 1, 5, 40}) {
      AttnCase c{128, group, {}, {}, 0, 4};
      for (int i = 0; i < decodes; ++i) {
        c.q_lens.push_back(1);
        c.prefix_lens.push_back(static_cast<int>(Rng()() % 3000));
      }
      c.q_lens.insert(c.q_lens.end(), {200, 77, 1});
      c.prefix_lens.insert(c.prefix_lens.end(), {0, 300, 50});
      c.num_decode_seqs = decodes;
      c.poison_tail = true;
      RunAttention(gpu(), c);
    }
  for (int group : {1, 8}) {
    RunAttention(gpu(), {128, group, {100, 129, 3}, {37, 200, 1}});    // chunks over odd prefixes
    RunAttention(gpu(), {128, group, {64, 65, 63}, {65, 63, 64}});
    RunAttention(gpu(), {128, group, {17, 300}, {1000, 511}});
  }
  // GQA groups 1/2/4/8 at 64 query heads.
  for (int group : {1, 2, 4, 8}) {
    const int hk = 64 / group;
    RunAttention(gpu(), {128, group, {1, 1, 1}, {100, 2000, 5}, 0, hk});  // decode
    RunAttention(gpu(), {128, group, {77, 17}, {0, 50}, 0, hk});          // prefill + chunk
  }
}

// Block sizes other than 16: 5 (keys of a tile span partial blocks, division addressing), 1, 64.
TEST_F(CudaKernelTest, AttentionBlockSizes) {
  for (int bs : {5, 1, 64})
    for (int group : {1, 8}) {
      RunAttention(gpu(), {128, group, {1, 1, 1}, {0, 16, 300}, 0, 2, false, bs});       // decode
      RunAttention(gpu(), {128, group, {100, 29}, {0, 0}, 0, 2, false, bs});             // prefill
      RunAttention(gpu(), {64, group, {5, 64, 1}, {40, 129, 77}, 0, 2, false, bs});      // chunked + decode
    }
  RunAttention(gpu(), {256, 4, {1, 33}, {700, 71}, 0, 2, false, 5});
  RunAttention(gpu(), {48, 16, {1, 5}, {300, 40}, 32, 1, true, 5});  // MLA latent (SIMT), odd blocks
}

// The wgmma prefill kernel's edges (D 128, more than 16 tokens a sequence; every case also runs
// on mma.sync and SIMT, and the wgmma builds with the TMA and the cp.async producer): lengths
// around the 128-row / 128-key tiles at GQA groups 1/4/8, several sequences of different lengths,
// chunks over cached prefixes (q_len < seq_len, prefixes off the tiles), the block sizes TMA
// serves (8..128: 128 / block_size boxes a tile half; 256: one box inside a block) and ones it
// does not (5, 1, 24: the cp.async gather). Every cache slot past its sequence's end holds NaN:
// the CTA's last tile, partly past its keys, must not carry it into the output.
TEST_F(CudaKernelTest, AttentionWgmmaPrefill) {
  for (int group : {1, 4, 8}) {
    RunAttention(gpu(), {128, group, {127}, {0}, 0, 4, false, 16, true});
    RunAttention(gpu(), {128, group, {128}, {0}, 0, 4, false, 16, true});
    RunAttention(gpu(), {128, group, {129, 17}, {0, 0}, 0, 4, false, 16, true});
    RunAttention(gpu(), {128, group, {255, 257, 40}, {1, 128, 0}, 0, 4, false, 16, true});  // several lengths, prefixes
    RunAttention(gpu(), {128, group, {300, 33}, {1000, 4097}, 0, 4, false, 16, true});      // chunks over long prefixes
    RunAttention(gpu(), {128, group, {1100}, {0}, 0, 4, false, 16, true});                  // many key tiles
  }
  for (int bs : {8, 32, 64, 128, 256, 5, 1, 24, 384})
    for (int group : {1, 8}) {
      RunAttention(gpu(), {128, group, {200, 31}, {0, 77}, 0, 2, false, bs, true});
      RunAttention(gpu(), {128, group, {65, 129}, {300, 127}, 0, 2, false, bs, true});
    }
  // A block as long as each sequence, off the powers of two (TMA serves a one-block table).
  RunAttention(gpu(), {128, 4, {200, 31}, {0, 77}, 0, 2, false, 1000, true});
  // The flattened grid in both orders (the default picks KV heads fastest at these sizes).
  for (int heads_fastest : {0, 1}) {
    cuda::Tuning().attention_wgmma_heads_fastest = heads_fastest;
    RunAttention(gpu(), {128, 4, {300, 129}, {0, 500}, 0, 4, false, 16, true});
  }
  // Several full tiles inside one 256-key block, sequences ending mid-block and mid-tile.
  RunAttention(gpu(), {128, 4, {700, 300, 129}, {0, 213, 1000}, 0, 2, false, 256, true});
  RunAttention(gpu(), {128, 8, {600, 45, 384}, {0, 300, 0}, 0, 2, false, 16, true});
}

// The wgmma kernel at Dk 192, Dv 128 (DeepSeek-V3's decompressed MLA prefill: a KV head a query
// head, and a cache of one block holding the context): the 2-stage ring over many key tiles, row
// and key tiles cut off the 128s, chunks over prefixes, GQA groups too; each case with the TMA
// producer where the block size allows it and with the cp.async one.
TEST_F(CudaKernelTest, AttentionWgmmaPrefillDk192) {
  for (int group : {1, 4}) {
    RunAttention(gpu(), {192, group, {127}, {0}, 128, 4, false, 16, true});
    RunAttention(gpu(), {192, group, {129, 17}, {0, 0}, 128, 4, false, 16, true});
    RunAttention(gpu(), {192, group, {255, 257, 40}, {1, 128, 0}, 128, 2, false, 16, true});
    RunAttention(gpu(), {192, group, {300, 33}, {1000, 4097}, 128, 2, false, 16, true});
  }
  // 9 key tiles, 8 heads; the flattened grid in both orders (rows together is DeepSeek's).
  for (int heads_fastest : {0, 1}) {
    cuda::Tuning().attention_wgmma_heads_fastest = heads_fastest;
    RunAttention(gpu(), {192, 1, {1100}, {0}, 128, 8, false, 16, true});
  }
  // TMA boxes (K three 64-dim panels, V two) at 8 and 128 keys a box; the cp.async gather at 5
  // and 1; one block a sequence off the powers of two (DeepSeek's layout: TMA) and 384 (TMA).
  for (int bs : {8, 128, 5, 1, 1000, 384})
    RunAttention(gpu(), {192, 1, {200, 31}, {0, 77}, 128, 4, false, bs, true});
  RunAttention(gpu(), {192, 2, {500, 129}, {300, 0}, 128, 2, false, 384, true});
}

// One S = Q K^T tile (64 x 128 keys x D 128) and one O = P V tile (64 x 128 keys x D 128)
// through the wgmma wrappers and shared layouts of attention_wgmma.cu, against double-precision
// host products: a descriptor (V's MN-major LBO/SBO), swizzle or fragment-layout bug shows here
// alone. P V both as the kernel issues it (m64n128k16, "wide": reads the descriptor's LBO) and
// as 2 x m64n64k16 (one swizzle atom wide, no LBO): if only "narrow" passes, set kPvWide false.
// The first mismatching (row, column) is printed.
TEST_F(CudaKernelTest, AttentionWgmmaTileProbe) {
  if (!cuda::AttentionWgmmaSupported()) GTEST_SKIP() << "not an sm_90 device";
  cudaStream_t stream = static_cast<cuda::CudaBackend&>(gpu()).stream();
  // Rows of q and p carry a spike at their own column (plus noise): a permutation is visible.
  std::vector<float> q = RandomBf16(64 * 128, 0.25f), k = RandomBf16(128 * 128), pm = RandomBf16(64 * 128, 0.25f),
                     v = RandomBf16(128 * 128);
  for (int i = 0; i < 64; ++i) q[i * 128 + i] = pm[i * 128 + 2 * i] = 2.f;
  Tensor gq = Upload(gpu(), q, {64, 128}, DType::kBF16), gk = Upload(gpu(), k, {128, 128}, DType::kBF16);
  Tensor gp = Upload(gpu(), pm, {64, 128}, DType::kBF16), gv = Upload(gpu(), v, {128, 128}, DType::kBF16);
  std::vector<float> s_ref(64 * 128), o_ref(64 * 128);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 128; ++n) {
      double s = 0, o = 0;
      for (int kk = 0; kk < 128; ++kk) {
        s += double(q[m * 128 + kk]) * k[n * 128 + kk];
        o += double(pm[m * 128 + kk]) * v[kk * 128 + n];
      }
      s_ref[m * 128 + n] = static_cast<float>(s);
      o_ref[m * 128 + n] = static_cast<float>(o);
    }
  auto check = [](const char* what, const std::vector<float>& got, const std::vector<float>& ref) {
    const double e = RelError(got, ref);
    Record("AttentionWgmmaTileProbe", what, e, kF32Tol);
    EXPECT_LT(e, kF32Tol) << what;
    for (size_t i = 0; i < got.size(); ++i)
      if (!(std::fabs(got[i] - ref[i]) <= 1e-3f * (1.f + std::fabs(ref[i])))) {
        ADD_FAILURE() << what << ": first mismatch at row " << i / 128 << " column " << i % 128 << ": got " << got[i]
                      << ", expected " << ref[i];
        break;
      }
  };
  for (bool wide : {true, false}) {
    Tensor gs = gpu().Empty(DType::kF32, {64, 128}), go = gpu().Empty(DType::kF32, {64, 128});
    Poison(gpu(), gs);
    Poison(gpu(), go);
    cuda::AttentionWgmmaTileProbe(gq, gk, gp, gv, gs, go, wide, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    check(wide ? "S=QK^T 64x128x128" : "S=QK^T 64x128x128 (narrow run)", Download(gpu(), gs), s_ref);
    check(wide ? "O=PV m64n128k16 (wide)" : "O=PV 2x m64n64k16 (narrow)", Download(gpu(), go), o_ref);
  }
}

// Qwen3-30B-A3B's attention (Hk 4, group 8, D 128) at decode batches 1, 2, 3, 8 and contexts
// 1, 100, 1024, 8192 (all sequences at the context, and mixed lengths up to it): the split-KV
// plans of small batches, fused and separate merge.
TEST_F(CudaKernelTest, AttentionDecodeSmallBatch) {
  for (int ctx : {1, 100, 1024, 8192})
    for (int b : {1, 2, 3, 8}) {
      RunAttention(gpu(), {128, 8, std::vector<int>(b, 1), std::vector<int>(b, ctx - 1), 0, 4});
      if (b > 1) {
        std::vector<int> prefixes(b);
        for (int i = 0; i < b; ++i) prefixes[i] = static_cast<int>(Rng()() % ctx);
        RunAttention(gpu(), {128, 8, std::vector<int>(b, 1), prefixes, 0, 4});
      }
    }
}

// Decode batch of 64 at up to 8k context (Qwen3-30B-A3B's group of 8): split-KV over lengths that
// differ per sequence.
TEST_F(CudaKernelTest, AttentionDecodeBatch64Ctx8k) {
  std::vector<int> q_lens(64, 1), prefixes(64);
  for (int b = 0; b < 64; ++b) prefixes[b] = b % 4 == 0 ? 8191 : 7000 + static_cast<int>(Rng()() % 1191);
  RunAttention(gpu(), {128, 8, q_lens, prefixes, 0, 2});
}

// The small-batch decode kernel (attention_decode.cu) against the CPU twin, every case through
// its split settings (DecodeVariants) and the mma one: contexts 1, 7, 100, 1024 (and 8192), GQA
// groups 1/4/8/16 (two row blocks past 8; 12 off both), block sizes 1/5/16/64, D 64/128/256,
// batches 1/2/3/8/64, NaN in every cache slot past a sequence's end. Then CUDA-graph replays of
// a step (fused merge: the counters re-arm, the output is poisoned before each replay). The
// cluster-merge and wide-merge variants must have run their builds (not only the fallbacks).
TEST_F(CudaKernelTest, AttentionDecodeKernel) {
  const int64_t cluster_launches = cuda::AttentionDecodeClusterLaunches();
  const int64_t wide_launches = cuda::AttentionDecodeWideMergeLaunches();
  const int64_t cluster_cuts = cuda::AttentionDecodeClusterCuts();
  for (int group : {1, 4, 8, 16})
    for (int bs : {1, 5, 16, 64}) {
      RunAttention(gpu(), {128, group, {1, 1, 1}, {0, 6, 99}, 0, 2, false, bs, true, true});
      RunAttention(gpu(), {128, group, {1, 1}, {1023, 300}, 0, 2, false, bs, true, true});
    }
  RunAttention(gpu(), {128, 12, {1, 1}, {1023, 64}, 0, 1, false, 16, true, true});
  for (int d : {64, 256})
    for (int group : {1, 4, 16})
      for (int bs : {5, 16}) RunAttention(gpu(), {d, group, {1, 1, 1, 1}, {0, 6, 99, 1023}, 0, 2, false, bs, true, true});
  for (int b : {1, 2, 3, 8, 64}) {
    std::vector<int> prefixes(b);
    for (int i = 0; i < b; ++i) prefixes[i] = static_cast<int>(Rng()() % 1024);
    RunAttention(gpu(), {128, 8, std::vector<int>(b, 1), std::vector<int>(b, 1023), 0, 4, false, 16, true, true});
    RunAttention(gpu(), {128, 8, std::vector<int>(b, 1), prefixes, 0, 4, false, 16, true, true});
  }
  for (int b : {1, 3, 8}) RunAttention(gpu(), {128, 8, std::vector<int>(b, 1), std::vector<int>(b, 8191), 0, 4, false, 16, true, true});
  RunAttention(gpu(), {128, 16, {1}, {8191}, 0, 2, false, 64, true, true});
  // CUDA-graph replay.
  RunAttention(gpu(), {128, 8, {1, 1}, {1023, 99}, 0, 4, false, 16, true, true, true});
  RunAttention(gpu(), {128, 8, {1}, {8191}, 0, 4, false, 16, true, true, true});
  RunAttention(gpu(), {64, 16, {1, 1, 1}, {0, 500, 77}, 0, 2, false, 5, true, true, true});
  EXPECT_GT(cuda::AttentionDecodeClusterLaunches(), cluster_launches) << "the cluster merge never ran";
  EXPECT_GT(cuda::AttentionDecodeWideMergeLaunches(), wide_launches) << "the wide merge never ran";
  // Batch 8 x 4 KV heads at 1024 keys planned for 264 CTAs is 32 clusters of 8 splits, more than
  // an H100 or H200 holds at once (30): the one-wave rule must cut it (to 7 splits there).
  const cuda::KernelTuning saved = cuda::Tuning();
  cuda::Tuning().attention_decode_cluster_min_ctas = 0;
  RunAttention(gpu(), {128, 8, std::vector<int>(8, 1), std::vector<int>(8, 1023), 0, 4, false, 16,
                       true, true, true});
  cuda::Tuning() = saved;
  EXPECT_GT(cuda::AttentionDecodeClusterCuts(), cluster_cuts)
      << "no cluster plan was cut to one wave";
}

}  // namespace corolla::cuda_test
