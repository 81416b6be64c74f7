// Every CUDA kernel against its CPU twin (kernels/cpu/ops.h) over a shape sweep: one token,
// many, lengths off the tile, head dims 32/64/128/256, GQA groups 1/2/8, chunked prefill over a
// prefix, experts with zero or all tokens. Inputs are fresh bf16-rounded randoms, outputs are
// NaN-poisoned first; bf16 outputs pass at ||out - ref|| / ||ref|| < 1e-2, f32 ones tighter.
// Runs only on a machine with a GPU (skips otherwise); scripts/gpu_run.sh runs it.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/test_util.h"

namespace corolla::cuda_test {

Backend* Gpu() {
  static std::unique_ptr<Backend> be = [] {
    auto r = MakeCudaBackend(0);
    return r.ok() ? std::move(r).value() : nullptr;
  }();
  return be.get();
}

class CudaKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Gpu() == nullptr) GTEST_SKIP() << "no CUDA device";
  }
  Backend& gpu() { return *Gpu(); }
};

constexpr double kBf16Tol = 1e-2;
constexpr double kF32Tol = 1e-4;

std::string Dims(std::initializer_list<int64_t> d) {
  std::string s;
  for (auto v : d) s += (s.empty() ? "" : "x") + std::to_string(v);
  return s;
}

TEST_F(CudaKernelTest, RmsNorm) {
  for (int64_t rows : {1, 7, 300})
    for (int64_t h : {128, 2048, 100})
      for (bool with_res : {false, true}) {
        auto x = RandomBf16(rows * h), w = RandomBf16(h), res = RandomBf16(rows * h, 4.f);
        Tensor cx = HostF32(x, {rows, h}), cw = HostF32(w, {h}), cres = HostF32(res, {rows, h});
        Tensor cout = Tensor::Empty(DType::kF32, {rows, h});
        cpu::RmsNorm(cx, cw, 1e-6f, cout, with_res ? &cres.view() : nullptr);
        Tensor gx = Upload(gpu(), x, {rows, h}, DType::kBF16), gw = Upload(gpu(), w, {h}, DType::kBF16);
        Tensor gres = Upload(gpu(), res, {rows, h}, DType::kBF16);
        Tensor gout = gpu().Empty(DType::kBF16, {rows, h});
        Poison(gpu(), gout);
        gpu().RmsNorm(gx, gw, 1e-6f, gout, with_res ? &gres.view() : nullptr);
        std::vector<float> ref(cout.ptr<float>(), cout.ptr<float>() + rows * h);
        double e = RelError(Download(gpu(), gout), ref);
        std::string shape = Dims({rows, h}) + (with_res ? " +res" : "");
        Record("RmsNorm", shape, e, kBf16Tol);
        EXPECT_LT(e, kBf16Tol) << shape;
        if (with_res) {
          std::vector<float> rref(cres.ptr<float>(), cres.ptr<float>() + rows * h);
          double er = RelError(Download(gpu(), gres), rref);
          Record("RmsNorm.residual", shape, er, kBf16Tol);
          EXPECT_LT(er, kBf16Tol) << shape;
        }
      }
}

// q/k views strided inside a fused [T, (Hq + 2Hk) * D] buffer, as the model uses them.
struct FusedHeads {
  std::vector<float> host;  // [T, width]
  int64_t tokens, width, d;
  TensorView View(const Tensor& t, int64_t first_head, int64_t heads) const {
    TensorView v = t.view();
    v.data = static_cast<char*>(v.data) + first_head * d * DTypeSize(v.dtype);
    v.shape = {tokens, heads, d};
    v.strides = {width, d, 1, 0};
    return v;
  }
};

TEST_F(CudaKernelTest, HeadRmsNormAndRope) {
  for (int64_t d : {32, 64, 128, 256, 48})
    for (int64_t tokens : {1, 33}) {
      const int64_t hq = 4, hk = 2, width = (hq + 2 * hk) * d;
      FusedHeads f{RandomBf16(tokens * width, 2.f), tokens, width, d};
      auto wq = RandomBf16(d), wk = RandomBf16(d);
      std::vector<int32_t> pos(tokens);
      for (auto& p : pos) p = static_cast<int32_t>(Rng()() % 5000);
      for (int64_t rot : {d, d / 2}) {
        if (rot % 2) continue;
        Tensor c = HostF32(f.host, {tokens, width});
        Tensor g = Upload(gpu(), f.host, {tokens, width}, DType::kBF16);
        Tensor gwq = Upload(gpu(), wq, {d}, DType::kBF16), gwk = Upload(gpu(), wk, {d}, DType::kBF16);
        Tensor cwq = HostF32(wq, {d}), cwk = HostF32(wk, {d});
        Tensor cpos = HostI32(pos, {tokens});
        Tensor gpos = UploadI32(gpu(), pos, {tokens});
        cpu::HeadRmsNorm(f.View(c, 0, hq), cwq, 1e-6f);
        cpu::HeadRmsNorm(f.View(c, hq, hk), cwk, 1e-6f);
        gpu().HeadRmsNorm(f.View(g, 0, hq), gwq, 1e-6f);
        gpu().HeadRmsNorm(f.View(g, hq, hk), gwk, 1e-6f);
        std::vector<float> ref(c.ptr<float>(), c.ptr<float>() + tokens * width);
        double e = RelError(Download(gpu(), g), ref);
        std::string shape = "T" + std::to_string(tokens) + " D" + std::to_string(d);
        if (rot == d) {
          Record("HeadRmsNorm", shape, e, kBf16Tol);
          EXPECT_LT(e, kBf16Tol) << shape;
        }
        RopeParams rp{static_cast<int>(rot), 1e6f};
        cpu::Rope(f.View(c, 0, hq), f.View(c, hq, hk), cpos, rp);
        gpu().Rope(f.View(g, 0, hq), f.View(g, hq, hk), gpos, rp);
        ref.assign(c.ptr<float>(), c.ptr<float>() + tokens * width);
        e = RelError(Download(gpu(), g), ref);
        Record("HeadRmsNorm+Rope", shape + " rot" + std::to_string(rot), e, kBf16Tol);
        EXPECT_LT(e, kBf16Tol) << shape << " rot " << rot;
      }
    }
}

TEST_F(CudaKernelTest, SiluMulAddGatherEmbedding) {
  for (int64_t rows : {1, 37})
    for (int64_t inter : {64, 768, 100}) {
      auto gu = RandomBf16(rows * 2 * inter, 4.f);
      Tensor c_in = HostF32(gu, {rows, 2 * inter}), c_out = Tensor::Empty(DType::kF32, {rows, inter});
      cpu::SiluMul(c_in, c_out);
      Tensor g_in = Upload(gpu(), gu, {rows, 2 * inter}, DType::kBF16);
      Tensor g_out = gpu().Empty(DType::kBF16, {rows, inter});
      Poison(gpu(), g_out);
      gpu().SiluMul(g_in, g_out);
      double e = RelError(Download(gpu(), g_out),
                          std::vector<float>(c_out.ptr<float>(), c_out.ptr<float>() + rows * inter));
      Record("SiluMul", Dims({rows, inter}), e, kBf16Tol);
      EXPECT_LT(e, kBf16Tol);

      auto a = RandomBf16(rows * inter), b = RandomBf16(rows * inter);
      Tensor ca = HostF32(a, {rows, inter}), cb = HostF32(b, {rows, inter});
      cpu::Add(ca, cb);
      Tensor ga = Upload(gpu(), a, {rows, inter}, DType::kBF16), gb = Upload(gpu(), b, {rows, inter}, DType::kBF16);
      gpu().Add(ga, gb);
      e = RelError(Download(gpu(), ga), std::vector<float>(ca.ptr<float>(), ca.ptr<float>() + rows * inter));
      Record("Add", Dims({rows, inter}), e, kBf16Tol);
      EXPECT_LT(e, kBf16Tol);

      const int64_t vocab = 1000;
      auto table = RandomBf16(vocab * inter);
      std::vector<int32_t> ids(rows);
      for (auto& i : ids) i = static_cast<int32_t>(Rng()() % vocab);
      Tensor ctab = HostF32(table, {vocab, inter}), cids = HostI32(ids, {rows});
      Tensor cemb = Tensor::Empty(DType::kF32, {rows, inter});
      cpu::Embedding(cids, ctab, cemb);
      Tensor gtab = gpu().LoadWeight(ctab);  // f32 host -> bf16 device (exact: values are bf16)
      Tensor gids = UploadI32(gpu(), ids, {rows});
      Tensor gemb = gpu().Empty(DType::kBF16, {rows, inter});
      Poison(gpu(), gemb);
      gpu().Embedding(gids, gtab, gemb);
      e = RelError(Download(gpu(), gemb), std::vector<float>(cemb.ptr<float>(), cemb.ptr<float>() + rows * inter));
      Record("Embedding", Dims({rows, inter}), e, 0);
      EXPECT_EQ(e, 0.0);
      Tensor ggat = gpu().Empty(DType::kBF16, {rows, inter});
      Poison(gpu(), ggat);
      gpu().GatherRows(gtab, gids, ggat);
      e = RelError(Download(gpu(), ggat), std::vector<float>(cemb.ptr<float>(), cemb.ptr<float>() + rows * inter));
      Record("GatherRows", Dims({rows, inter}), e, 0);
      EXPECT_EQ(e, 0.0);
    }
}

TEST_F(CudaKernelTest, Linear) {
  struct Case { int64_t m, k, n; bool f32_out; bool strided; };
  for (Case c : {Case{1, 128, 256, false, false}, Case{37, 256, 1000, false, true},
                 Case{128, 2048, 4096, false, false}, Case{5, 2048, 128, true, true},
                 Case{64, 1024, 151936 / 16, true, false}}) {
    const int64_t ldx = c.strided ? c.k + 64 : c.k;
    auto x = RandomBf16(c.m * ldx), w = RandomBf16(c.n * c.k, 1.f / std::sqrt(float(c.k)));
    Tensor cx_full = HostF32(x, {c.m, ldx});
    TensorView cx = cx_full.view();
    cx.shape = {c.m, c.k};
    Tensor cw = HostF32(w, {c.n, c.k}), cout = Tensor::Empty(DType::kF32, {c.m, c.n});
    cpu::Linear(cx, cw, cout);
    Tensor gx_full = Upload(gpu(), x, {c.m, ldx}, DType::kBF16);
    TensorView gx = gx_full.view();
    gx.shape = {c.m, c.k};
    Tensor gw = gpu().LoadWeight(cw);
    Tensor gout = gpu().Empty(c.f32_out ? DType::kF32 : DType::kBF16, {c.m, c.n});
    Poison(gpu(), gout);
    gpu().Linear(gx, gw, gout);
    double e = RelError(Download(gpu(), gout), std::vector<float>(cout.ptr<float>(), cout.ptr<float>() + c.m * c.n));
    double tol = c.f32_out ? 1e-3 : kBf16Tol;  // bf16 products, fp32 accumulation
    std::string shape = Dims({c.m, c.k, c.n}) + (c.f32_out ? " f32out" : " bf16out") + (c.strided ? " strided" : "");
    Record("Linear", shape, e, tol);
    EXPECT_LT(e, tol) << shape;
  }
}

// Builds a paged cache holding random K/V for every sequence's prefix, then KvWrite of this
// step's tokens and Attention, on both backends.
struct AttnCase {
  int d, group;
  std::vector<int> q_lens, prefix_lens;
};

void RunAttention(Backend& gpu, const AttnCase& c) {
  const int hk = 2, hq = hk * c.group, bs = 16, d = c.d;
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
  std::vector<int32_t> tables(num_seqs * max_blocks, 0);
  int next = 0;
  for (int b = 0; b < num_seqs; ++b)
    for (int j = 0; j < (seq_lens[b] + bs - 1) / bs; ++j) tables[b * max_blocks + j] = perm[next++];
  for (int b = 0; b < num_seqs; ++b)
    for (int p = c.prefix_lens[b]; p < seq_lens[b]; ++p) {
      slots.push_back(tables[b * max_blocks + p / bs] * bs + p % bs);
      positions.push_back(p);
    }
  const int64_t tokens = qstart.back();
  const int64_t cache_n = int64_t{num_blocks} * hk * bs * d;
  auto kc = RandomBf16(cache_n), vc = RandomBf16(cache_n);
  auto q = RandomBf16(tokens * hq * d, 2.f), k = RandomBf16(tokens * hk * d, 2.f), v = RandomBf16(tokens * hk * d);
  Shape cshape{num_blocks, hk, bs, d};

  Tensor ckc = HostF32(kc, cshape), cvc = HostF32(vc, cshape);
  Tensor cq = HostF32(q, {tokens, hq, d}), ck = HostF32(k, {tokens, hk, d}), cv = HostF32(v, {tokens, hk, d});
  Tensor cqs = HostI32(qstart, {num_seqs + 1}), csl = HostI32(seq_lens, {num_seqs});
  Tensor ctab = HostI32(tables, {num_seqs, max_blocks}), cslot = HostI32(slots, {tokens});
  AttentionBatch cb{cqs, csl, ctab, cslot, max_q, max_len};
  KvCacheView ccache{ckc, cvc};
  cpu::KvWrite(ck, cv, ccache, cb);
  Tensor cout = Tensor::Empty(DType::kF32, {tokens, hq, d});
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  cpu::Attention(cq, ccache, cb, scale, cout);

  Tensor gkc = Upload(gpu, kc, cshape, DType::kBF16), gvc = Upload(gpu, vc, cshape, DType::kBF16);
  Tensor gq = Upload(gpu, q, {tokens, hq, d}, DType::kBF16), gk = Upload(gpu, k, {tokens, hk, d}, DType::kBF16);
  Tensor gv = Upload(gpu, v, {tokens, hk, d}, DType::kBF16);
  Tensor gqs = UploadI32(gpu, qstart, {num_seqs + 1}), gsl = UploadI32(gpu, seq_lens, {num_seqs});
  Tensor gtab = UploadI32(gpu, tables, {num_seqs, max_blocks}), gslot = UploadI32(gpu, slots, {tokens});
  AttentionBatch gb{gqs, gsl, gtab, gslot, max_q, max_len};
  KvCacheView gcache{gkc, gvc};
  gpu.KvWrite(gk, gv, gcache, gb);
  Tensor gout = gpu.Empty(DType::kBF16, {tokens, hq, d});
  Poison(gpu, gout);
  gpu.Attention(gq, gcache, gb, scale, gout);

  std::string shape = "D" + std::to_string(d) + " g" + std::to_string(c.group) + " q[";
  for (int b = 0; b < num_seqs; ++b) shape += std::to_string(c.q_lens[b]) + "+" + std::to_string(c.prefix_lens[b]) + (b + 1 < num_seqs ? "," : "]");
  double ek = RelError(Download(gpu, gkc), std::vector<float>(ckc.ptr<float>(), ckc.ptr<float>() + cache_n));
  double ev = RelError(Download(gpu, gvc), std::vector<float>(cvc.ptr<float>(), cvc.ptr<float>() + cache_n));
  Record("KvWrite", shape, std::max(ek, ev), 0);
  EXPECT_EQ(ek, 0.0) << shape;
  EXPECT_EQ(ev, 0.0) << shape;
  double e = RelError(Download(gpu, gout), std::vector<float>(cout.ptr<float>(), cout.ptr<float>() + tokens * hq * d));
  Record("Attention", shape, e, kBf16Tol);
  EXPECT_LT(e, kBf16Tol) << shape;
}

TEST_F(CudaKernelTest, KvWriteAndAttention) {
  // Each case with split-KV off, at its default (splits while the grid is under-filled) and
  // forced wide (as many 32-key splits as the longest sequence has).
  const int default_min_ctas = cuda::Tuning().attention_split_min_ctas;
  for (int min_ctas : {0, default_min_ctas, 1 << 20}) {
    cuda::Tuning().attention_split_min_ctas = min_ctas;
    for (int d : {32, 64, 128, 256})
      for (int group : {1, 2, 8}) {
        RunAttention(gpu(), {d, group, {1, 1, 1}, {0, 16, 300}});           // decode
        RunAttention(gpu(), {d, group, {37, 100}, {0, 0}});                 // prefill
        RunAttention(gpu(), {d, group, {5, 64, 1}, {40, 129, 77}});         // chunked prefill + decode
        RunAttention(gpu(), {d, group, {1, 2, 1, 1}, {31, 65, 1000, 7}});   // decode, split edges
      }
    RunAttention(gpu(), {128, 8, {1}, {4095}});  // long decode
  }
  cuda::Tuning().attention_split_min_ctas = default_min_ctas;
}

TEST_F(CudaKernelTest, MoeRoute) {
  for (int64_t tokens : {1, 100})
    for (int experts : {8, 16, 128, 512})
      for (int k : {1, 2, 8}) {
        if (k > experts) continue;
        for (bool renorm : {true, false}) {
          auto logits = RandomBf16(tokens * experts, 3.f);
          Tensor cl = HostF32(logits, {tokens, experts});
          Tensor cids = Tensor::Empty(DType::kI32, {tokens, k}), cw = Tensor::Empty(DType::kF32, {tokens, k});
          cpu::MoeRoute(cl, {k, renorm}, cids, cw);
          Tensor gl = Upload(gpu(), logits, {tokens, experts}, DType::kF32);
          Tensor gids = gpu().Empty(DType::kI32, {tokens, k}), gw = gpu().Empty(DType::kF32, {tokens, k});
          Poison(gpu(), gw);
          gpu().MoeRoute(gl, {k, renorm}, gids, gw);
          auto ids = DownloadI32(gpu(), gids);
          int mismatches = 0;
          for (int64_t i = 0; i < tokens * k; ++i) mismatches += ids[i] != cids.ptr<int32_t>()[i];
          double e = RelError(Download(gpu(), gw), std::vector<float>(cw.ptr<float>(), cw.ptr<float>() + tokens * k));
          std::string shape = Dims({tokens, experts}) + " k" + std::to_string(k) + (renorm ? " renorm" : "");
          Record("MoeRoute.weights", shape, e, kF32Tol);
          Record("MoeRoute.id_mismatches", shape, mismatches, 0);
          EXPECT_EQ(mismatches, 0) << shape;
          EXPECT_LT(e, kF32Tol) << shape;
        }
      }
}

TEST_F(CudaKernelTest, MoeExperts) {
  struct Case { int64_t tokens; int experts, k; int64_t hidden, inter; int mode; };  // mode 0 random, 1 all on one expert
  // Each case through the tiled grouped GEMM and through the memory-bound decode GEMVs
  // (1, 2, 3-4, 5-8 and over 8 tokens per expert: several passes).
  const int64_t default_max_pairs = cuda::Tuning().moe_decode_max_pairs;
  for (Case c : {Case{1, 8, 2, 128, 64, 0}, Case{5, 16, 4, 128, 64, 0}, Case{130, 16, 4, 256, 192, 0},
                 Case{130, 8, 2, 256, 192, 1}, Case{64, 128, 8, 2048, 768, 0}, Case{3, 64, 8, 512, 136, 0},
                 Case{200, 4, 1, 128, 64, 1}, Case{1, 128, 8, 2048, 768, 0}, Case{3, 8, 2, 200, 72, 1},
                 Case{6, 8, 2, 256, 64, 1}, Case{17, 8, 2, 136, 200, 1}, Case{256, 128, 8, 2048, 768, 0}}) {
    const int64_t t = c.tokens, h = c.hidden, inter = c.inter;
    auto x = RandomBf16(t * h);
    auto wgu = RandomBf16(int64_t{c.experts} * 2 * inter * h, 1.f / std::sqrt(float(h)));
    auto wd = RandomBf16(int64_t{c.experts} * h * inter, 1.f / std::sqrt(float(inter)));
    std::vector<int32_t> ids(t * c.k);
    std::vector<float> w(t * c.k);
    for (int64_t i = 0; i < t; ++i) {
      std::vector<int32_t> all(c.experts);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), Rng());
      if (c.mode == 1) std::swap(all[0], *std::find(all.begin(), all.end(), 3));  // expert 3 gets every token
      for (int s = 0; s < c.k; ++s) {
        ids[i * c.k + s] = all[s];
        w[i * c.k + s] = std::uniform_real_distribution<float>(0.05f, 1.f)(Rng());
      }
    }
    Tensor cx = HostF32(x, {t, h}), cgu = HostF32(wgu, {c.experts, 2 * inter, h}), cd = HostF32(wd, {c.experts, h, inter});
    Tensor cids = HostI32(ids, {t, c.k}), cw = HostF32(w, {t, c.k}), cout = Tensor::Empty(DType::kF32, {t, h});
    cpu::MoeExperts(cx, cids, cw, cgu, cd, cout);
    Tensor gx = Upload(gpu(), x, {t, h}, DType::kBF16);
    Tensor ggu = gpu().LoadWeight(cgu), gd = gpu().LoadWeight(cd);
    Tensor gids = UploadI32(gpu(), ids, {t, c.k}), gw = Upload(gpu(), w, {t, c.k}, DType::kF32);
    for (int variant = 0; variant < 3; ++variant) {  // tiled, gemv, gemv with the multi-CTA permute
      const int64_t max_pairs = variant == 0 ? 0 : int64_t{1} << 40;
      cuda::Tuning().moe_decode_max_pairs = max_pairs;
      cuda::Tuning().moe_fused_permute = variant != 2;
      Tensor gout = gpu().Empty(DType::kBF16, {t, h});
      Poison(gpu(), gout);
      gpu().MoeExperts(gx, gids, gw, ggu, gd, gout);
      double e = RelError(Download(gpu(), gout), std::vector<float>(cout.ptr<float>(), cout.ptr<float>() + t * h));
      std::string shape = "T" + std::to_string(t) + " E" + std::to_string(c.experts) + " k" + std::to_string(c.k) +
                          " H" + std::to_string(h) + " I" + std::to_string(inter) + (c.mode ? " one-expert" : "") +
                          (variant == 0 ? " tiled" : variant == 1 ? " gemv" : " gemv 4-kernel permute");
      Record("MoeExperts", shape, e, kBf16Tol);
      EXPECT_LT(e, kBf16Tol) << shape;
    }
  }
  cuda::Tuning().moe_decode_max_pairs = default_max_pairs;
  cuda::Tuning().moe_fused_permute = true;
}

TEST_F(CudaKernelTest, Sample) {
  for (int64_t vocab : {1000, 151936}) {
    const int64_t batch = 16;
    std::vector<float> logits(batch * vocab);
    std::normal_distribution<float> nd(0.f, 3.f);
    for (auto& l : logits) l = nd(Rng());
    // Awkward rows: ties at the max, -inf and NaN entries, a row all -inf.
    logits[1 * vocab + 5] = logits[1 * vocab + 9] = 100.f;
    for (int64_t i = 0; i < vocab; i += 3) logits[2 * vocab + i] = -INFINITY;
    logits[2 * vocab + 1] = NAN;
    for (int64_t i = 0; i < vocab; ++i) logits[3 * vocab + i] = -INFINITY;
    std::vector<SamplingParams> params(batch);
    std::vector<uint64_t> steps(batch);
    for (int64_t b = 0; b < batch; ++b) {
      SamplingParams& p = params[b];
      p.seed = 1000 + b;
      steps[b] = b * 7;
      switch (b % 8) {
        case 0: p.temperature = 0; break;                                   // greedy
        case 1: p.temperature = 1.f; break;                                 // full distribution
        case 2: p.temperature = 0.7f; p.top_k = 50; break;
        case 3: p.temperature = 1.f; p.top_p = 0.9f; break;
        case 4: p.temperature = 0.6f; p.top_k = 20; p.top_p = 0.95f; break;
        case 5: p.temperature = 1.2f; p.min_p = 0.05f; break;
        case 6: p.temperature = 1.f; p.top_k = 1; break;
        case 7: p.temperature = 0.8f; p.top_p = 0.5f; p.min_p = 0.1f; break;
      }
    }
    std::vector<int32_t> ref(batch), got(batch);
    cpu::SampleBatch(logits.data(), batch, vocab, params.data(), steps.data(), ref.data());
    Tensor g = Upload(gpu(), logits, {batch, vocab}, DType::kF32);
    int mismatches = 0;
    for (int rep = 0; rep < 4; ++rep) {  // several steps: different draws
      for (auto& s : steps) s += 1;
      cpu::SampleBatch(logits.data(), batch, vocab, params.data(), steps.data(), ref.data());
      gpu().Sample(g, params.data(), steps.data(), got.data());
      for (int64_t b = 0; b < batch; ++b) {
        if (got[b] != ref[b]) {
          ++mismatches;
          ADD_FAILURE() << "vocab " << vocab << " row " << b << " (mode " << b % 8 << "): gpu " << got[b] << " cpu " << ref[b];
        }
      }
    }
    Record("Sample.mismatches", "B16 V" + std::to_string(vocab) + " x4 steps", mismatches, 0);
  }
}

}  // namespace corolla::cuda_test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  auto& rows = corolla::cuda_test::Results();
  if (!rows.empty()) {
    std::printf("\n%-24s %-40s %12s %10s\n", "kernel", "case", "error", "tolerance");
    for (const auto& r : rows)
      std::printf("%-24s %-40s %12.3e %10.1e%s\n", r.kernel.c_str(), r.shape.c_str(), r.error, r.tolerance,
                  r.error > r.tolerance && r.tolerance > 0 ? "  FAIL" : "");
  }
  return rc;
}
