// Every CUDA kernel against its CPU twin (kernels/cpu/ops.h) over a shape sweep: one token,
// many, lengths off the tile, head dims 32/64/128/256, chunked prefill over a prefix, experts
// with zero or all tokens (attention and KvWrite: attention_kernel_test.cc; MoeExperts:
// moe_kernel_test.cc). Inputs are fresh bf16-rounded randoms, outputs are
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

// DeepSeek routing: sigmoid scores, selection bias, group-limited top-k, scaling.
TEST_F(CudaKernelTest, MoeRouteGrouped) {
  struct Case { int experts, groups, topk_groups, k; bool sigmoid, bias; };
  for (int64_t tokens : {1, 100})
    for (Case c : {Case{16, 4, 2, 4, true, true}, Case{256, 8, 4, 8, true, true}, Case{256, 8, 4, 8, true, false},
                   Case{64, 8, 3, 6, false, false}, Case{512, 1, 1, 10, false, false}, Case{32, 32, 4, 4, true, true}}) {
      auto logits = RandomBf16(tokens * c.experts, 3.f);
      auto bias = RandomBf16(c.experts, 0.1f);
      MoeRouting r;
      r.top_k = c.k;
      r.sigmoid = c.sigmoid;
      r.num_groups = c.groups;
      r.topk_groups = c.topk_groups;
      r.scaling_factor = 2.5f;
      Tensor cl = HostF32(logits, {tokens, c.experts}), cb = HostF32(bias, {c.experts});
      Tensor cids = Tensor::Empty(DType::kI32, {tokens, c.k}), cw = Tensor::Empty(DType::kF32, {tokens, c.k});
      if (c.bias) r.correction_bias = cb;
      cpu::MoeRoute(cl, r, cids, cw);
      Tensor gl = Upload(gpu(), logits, {tokens, c.experts}, DType::kF32), gb = Upload(gpu(), bias, {c.experts}, DType::kF32);
      Tensor gids = gpu().Empty(DType::kI32, {tokens, c.k}), gw = gpu().Empty(DType::kF32, {tokens, c.k});
      Poison(gpu(), gw);
      r.correction_bias = c.bias ? gb.view() : TensorView();
      gpu().MoeRoute(gl, r, gids, gw);
      auto ids = DownloadI32(gpu(), gids);
      int mismatches = 0;
      for (int64_t i = 0; i < tokens * c.k; ++i) mismatches += ids[i] != cids.ptr<int32_t>()[i];
      double e = RelError(Download(gpu(), gw), std::vector<float>(cw.ptr<float>(), cw.ptr<float>() + tokens * c.k));
      std::string shape = Dims({tokens, c.experts}) + " g" + std::to_string(c.groups) + "/" + std::to_string(c.topk_groups) +
                          " k" + std::to_string(c.k) + (c.sigmoid ? " sigmoid" : " softmax") + (c.bias ? " bias" : "");
      Record("MoeRoute.grouped.weights", shape, e, kF32Tol);
      Record("MoeRoute.grouped.id_mismatches", shape, mismatches, 0);
      EXPECT_EQ(mismatches, 0) << shape;
      EXPECT_LT(e, kF32Tol) << shape;
    }
}

// Strided rank-2/3 copies (bf16 and f32, rows of any alignment) leave the rest of dst alone.
TEST_F(CudaKernelTest, Copy) {
  struct Case { Shape shape; int64_t src_pad, dst_pad, offset; DType dtype; };
  for (Case c : {Case{{7, 16}, 32, 0, 8, DType::kBF16}, Case{{33, 5, 16}, 3, 7, 1, DType::kBF16},
                 Case{{4, 3, 128}, 0, 0, 0, DType::kF32}, Case{{130, 16}, 112 - 16, 176 - 16, 64, DType::kBF16},
                 Case{{9, 13}, 1, 2, 3, DType::kF32}}) {
    const int r = c.shape.rank;
    const int64_t inner = c.shape[r - 1];
    // src/dst: [outer..., inner + pad] buffers, viewed at `offset` elements with the inner extent.
    auto make = [&](int64_t pad, int64_t offset, const std::vector<float>& vals, bool gpu_side, Tensor* owner) {
      Shape full = c.shape;
      full.dims[r - 1] = inner + pad;
      const int64_t n = full.numel() + offset;
      *owner = gpu_side ? Upload(gpu(), vals, {n}, c.dtype) : HostF32(vals, {n});
      TensorView v = owner->view();
      v.dtype = gpu_side ? c.dtype : DType::kF32;
      v.data = static_cast<char*>(v.data) + offset * DTypeSize(v.dtype);
      v.shape = c.shape;
      int64_t stride = 1;
      for (int i = r - 1; i >= 0; --i) {
        v.strides[i] = stride;
        stride *= full[i];
      }
      return v;
    };
    Shape full_src = c.shape, full_dst = c.shape;
    full_src.dims[r - 1] += c.src_pad;
    full_dst.dims[r - 1] += c.dst_pad;
    auto src_vals = RandomBf16(full_src.numel() + c.offset), dst_vals = RandomBf16(full_dst.numel() + c.offset);
    Tensor cs, cd, gs, gd;
    TensorView csv = make(c.src_pad, c.offset, src_vals, false, &cs), cdv = make(c.dst_pad, c.offset, dst_vals, false, &cd);
    TensorView gsv = make(c.src_pad, c.offset, src_vals, true, &gs), gdv = make(c.dst_pad, c.offset, dst_vals, true, &gd);
    cpu::Copy(csv, cdv);
    gpu().Copy(gsv, gdv);
    double e = RelError(Download(gpu(), gd), std::vector<float>(cd.ptr<float>(), cd.ptr<float>() + cd.numel()));
    std::string shape = c.shape.ToString() + (c.dtype == DType::kF32 ? " f32" : " bf16") + " pads " +
                        std::to_string(c.src_pad) + "/" + std::to_string(c.dst_pad) + " off " + std::to_string(c.offset);
    Record("Copy", shape, e, 0);
    EXPECT_EQ(e, 0.0) << shape;
  }
}

// ---- Gated DeltaNet ----------------------------------------------------------------------
// A flat batch of sequences, each continuing from a state slot (prefix > 0) or starting fresh.
struct LinearBatch {
  std::vector<int32_t> qstart{0}, seq_lens, slots;
  int max_q = 0;
  LinearBatch(const std::vector<int>& q_lens, const std::vector<int>& prefixes, int num_slots) {
    std::vector<int32_t> perm(num_slots);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), Rng());
    for (size_t b = 0; b < q_lens.size(); ++b) {
      qstart.push_back(qstart.back() + q_lens[b]);
      seq_lens.push_back(prefixes[b] + q_lens[b]);
      slots.push_back(perm[b]);
      max_q = std::max(max_q, q_lens[b]);
    }
  }
  int64_t tokens() const { return qstart.back(); }
  int num_seqs() const { return static_cast<int>(seq_lens.size()); }
  std::string Name() const {
    std::string s = "[";
    for (int b = 0; b < num_seqs(); ++b)
      s += std::to_string(qstart[b + 1] - qstart[b]) + "+" + std::to_string(seq_lens[b] - (qstart[b + 1] - qstart[b])) +
           (b + 1 < num_seqs() ? "," : "]");
    return s;
  }
};

// Columns [begin, begin + heads * dim) of a [T, width] buffer viewed as [T, heads, dim].
TensorView HeadCols(const Tensor& t, int64_t width, int64_t begin, int64_t heads, int64_t dim) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + begin * DTypeSize(v.dtype);
  v.shape = {t.view().dim(0), heads, dim};
  v.strides = {width, dim, 1, 0};
  return v;
}
TensorView Cols(const Tensor& t, int64_t width, int64_t begin, int64_t n) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + begin * DTypeSize(v.dtype);
  v.shape = {t.view().dim(0), n};
  v.strides = {width, 1, 0, 0};
  return v;
}

const std::vector<std::pair<std::vector<int>, std::vector<int>>>& LinearBatches() {
  static const std::vector<std::pair<std::vector<int>, std::vector<int>>> cases = {
      {{1}, {0}},                          // one fresh token
      {{1, 1, 1}, {5, 0, 130}},            // decode, one sequence starting
      {{37, 100}, {0, 0}},                 // prefill
      {{5, 64, 1, 2, 130}, {40, 0, 77, 1, 9}},  // chunks continuing (and one shorter than the conv history)
  };
  return cases;
}

TEST_F(CudaKernelTest, SigmoidMul) {
  for (int64_t rows : {1, 37})
    for (auto [n, groups] : {std::pair<int64_t, int64_t>{128, 1}, {512, 512}, {100, 4}}) {
      const int64_t width = n + 3;  // x strided inside a wider buffer
      auto x = RandomBf16(rows * width, 2.f), g = RandomBf16(rows * groups, 4.f);
      Tensor cx = HostF32(x, {rows, width}), cg = HostF32(g, {rows, groups});
      cpu::SigmoidMul(Cols(cx, width, 0, n), cg);
      Tensor gx = Upload(gpu(), x, {rows, width}, DType::kBF16), gg = Upload(gpu(), g, {rows, groups}, DType::kBF16);
      gpu().SigmoidMul(Cols(gx, width, 0, n), gg);
      double e = RelError(Download(gpu(), gx), std::vector<float>(cx.ptr<float>(), cx.ptr<float>() + rows * width));
      std::string shape = Dims({rows, n}) + " gate cols " + std::to_string(groups);
      Record("SigmoidMul", shape, e, kBf16Tol);
      EXPECT_LT(e, kBf16Tol) << shape;
    }
}

TEST_F(CudaKernelTest, CausalConv1d) {
  for (int64_t channels : {96, 300})
    for (const auto& [q_lens, prefixes] : LinearBatches()) {
      const int64_t kernel = 4, slots = 7;
      LinearBatch lb(q_lens, prefixes, slots);
      const int64_t t = lb.tokens(), width = channels + 5;  // x: columns of a wider projection
      auto x = RandomBf16(t * width, 2.f), w = RandomBf16(channels * kernel), st = RandomBf16(slots * channels * (kernel - 1));
      Tensor cx = HostF32(x, {t, width}), cw = HostF32(w, {channels, kernel}), cst = HostF32(st, {slots, channels, kernel - 1});
      Tensor cqs = HostI32(lb.qstart, {lb.num_seqs() + 1}), csl = HostI32(lb.seq_lens, {lb.num_seqs()});
      Tensor cslots = HostI32(lb.slots, {lb.num_seqs()});
      Tensor cout = Tensor::Empty(DType::kF32, {t, channels});
      AttentionBatch cb{cqs, csl, TensorView(), TensorView(), lb.max_q, 0};
      cpu::CausalConv1d(Cols(cx, width, 0, channels), cw, cst, cslots, cb, cout);
      Tensor gx = Upload(gpu(), x, {t, width}, DType::kBF16), gw = Upload(gpu(), w, {channels, kernel}, DType::kBF16);
      Tensor gst = Upload(gpu(), st, {slots, channels, kernel - 1}, DType::kF32);
      Tensor gqs = UploadI32(gpu(), lb.qstart, {lb.num_seqs() + 1}), gsl = UploadI32(gpu(), lb.seq_lens, {lb.num_seqs()});
      Tensor gslots = UploadI32(gpu(), lb.slots, {lb.num_seqs()});
      Tensor gout = gpu().Empty(DType::kBF16, {t, channels});
      Poison(gpu(), gout);
      AttentionBatch gb{gqs, gsl, TensorView(), TensorView(), lb.max_q, 0};
      gpu().CausalConv1d(Cols(gx, width, 0, channels), gw, gst, gslots, gb, gout);
      const std::string shape = "C" + std::to_string(channels) + " " + lb.Name();
      double e = RelError(Download(gpu(), gout), std::vector<float>(cout.ptr<float>(), cout.ptr<float>() + t * channels));
      double es = RelError(Download(gpu(), gst), std::vector<float>(cst.ptr<float>(), cst.ptr<float>() + cst.numel()));
      Record("CausalConv1d", shape, e, kBf16Tol);
      Record("CausalConv1d.state", shape, es, 0);
      EXPECT_LT(e, kBf16Tol) << shape;
      EXPECT_EQ(es, 0.0) << shape;  // the state holds inputs: exact
    }
}

// The recurrent state in f32 and in bf16 (--linear-state-dtype bf16: read widened, written back
// rounded once per chunk, on both backends). The bf16 state's bound is the bf16 one: where the
// two backends' f32 sums differ in the last bits, a rounding may go the other way (one ulp).
TEST_F(CudaKernelTest, GatedDeltaRule) {
  struct Heads { int64_t hk, hv, dk, dv; };
  for (DType state_dtype : {DType::kF32, DType::kBF16})
    for (Heads h : {Heads{2, 4, 32, 32}, Heads{1, 1, 64, 64}, Heads{16, 64, 128, 128}, Heads{2, 2, 128, 96}})
      for (const auto& [q_lens, prefixes] : LinearBatches()) {
        const int64_t slots = 6;
        LinearBatch lb(q_lens, prefixes, slots);
        const int64_t t = lb.tokens();
        // q | k | v columns of one mixed buffer, b | a columns of a projection of odd width.
        const int64_t width = 2 * h.hk * h.dk + h.hv * h.dv, pw = 2 * h.hv + 3;
        auto mixed = RandomBf16(t * width, 1.f), proj = RandomBf16(t * pw, 3.f);
        auto alog = RandomBf16(h.hv, 1.f), dtb = RandomBf16(h.hv, 1.f), st = RandomBf16(slots * h.hv * h.dk * h.dv, 0.2f);
        const Shape sshape{slots, h.hv, h.dk, h.dv};
        const bool bf16_state = state_dtype == DType::kBF16;
        Tensor cm = HostF32(mixed, {t, width}), cp = HostF32(proj, {t, pw});
        Tensor cal = HostF32(alog, {h.hv}), cdt = HostF32(dtb, {h.hv}), cst = HostF32(st, sshape);
        if (bf16_state) {  // the CPU twin's bf16 state (st is bf16-exact)
          cst = Tensor::Empty(DType::kBF16, sshape);
          for (size_t i = 0; i < st.size(); ++i) cst.ptr<bf16>()[i] = ToBf16(st[i]);
        }
        Tensor cqs = HostI32(lb.qstart, {lb.num_seqs() + 1}), csl = HostI32(lb.seq_lens, {lb.num_seqs()});
        Tensor cslots = HostI32(lb.slots, {lb.num_seqs()});
        Tensor cout = Tensor::Empty(DType::kF32, {t, h.hv, h.dv});
        AttentionBatch cb{cqs, csl, TensorView(), TensorView(), lb.max_q, 0};
        auto run = [&](Backend* be, const Tensor& m, const Tensor& p, const Tensor& al, const Tensor& dt, const Tensor& s,
                       const Tensor& sl, const AttentionBatch& ab, const Tensor& out) {
          TensorView q = HeadCols(m, width, 0, h.hk, h.dk), k = HeadCols(m, width, h.hk * h.dk, h.hk, h.dk);
          TensorView v = HeadCols(m, width, 2 * h.hk * h.dk, h.hv, h.dv);
          TensorView b = Cols(p, pw, 1, h.hv), a = Cols(p, pw, 1 + h.hv, h.hv);
          if (be == nullptr)
            cpu::GatedDeltaRule(q, k, v, a, b, al, dt, s, sl, ab, out);
          else
            be->GatedDeltaRule(q, k, v, a, b, al, dt, s, sl, ab, out);
        };
        run(nullptr, cm, cp, cal, cdt, cst, cslots, cb, cout);
        Tensor gm = Upload(gpu(), mixed, {t, width}, DType::kBF16), gp = Upload(gpu(), proj, {t, pw}, DType::kBF16);
        Tensor gal = Upload(gpu(), alog, {h.hv}, DType::kF32), gdt = Upload(gpu(), dtb, {h.hv}, DType::kF32);
        Tensor gst = Upload(gpu(), st, sshape, state_dtype);
        Tensor gqs = UploadI32(gpu(), lb.qstart, {lb.num_seqs() + 1}), gsl = UploadI32(gpu(), lb.seq_lens, {lb.num_seqs()});
        Tensor gslots = UploadI32(gpu(), lb.slots, {lb.num_seqs()});
        Tensor gout = gpu().Empty(DType::kBF16, {t, h.hv, h.dv});
        Poison(gpu(), gout);
        AttentionBatch gb{gqs, gsl, TensorView(), TensorView(), lb.max_q, 0};
        run(&gpu(), gm, gp, gal, gdt, gst, gslots, gb, gout);
        const std::string shape = "Hk" + std::to_string(h.hk) + " Hv" + std::to_string(h.hv) + " Dk" + std::to_string(h.dk) +
                                  " Dv" + std::to_string(h.dv) + " " + lb.Name() + (bf16_state ? " bf16 state" : "");
        std::vector<float> ref_state(cst.numel());
        for (int64_t i = 0; i < cst.numel(); ++i)
          ref_state[i] = bf16_state ? ToFloat(cst.ptr<bf16>()[i]) : cst.ptr<float>()[i];
        double e = RelError(Download(gpu(), gout), std::vector<float>(cout.ptr<float>(), cout.ptr<float>() + cout.numel()));
        double es = RelError(Download(gpu(), gst), ref_state);
        const double state_tol = bf16_state ? kBf16Tol : 1e-3;
        Record("GatedDeltaRule", shape, e, kBf16Tol);
        Record("GatedDeltaRule.state", shape, es, state_tol);
        EXPECT_LT(e, kBf16Tol) << shape;
        EXPECT_LT(es, state_tol) << shape;
      }
}

TEST_F(CudaKernelTest, GatedRmsNorm) {
  for (int64_t t : {1, 37})
    for (auto [heads, d] : {std::pair<int64_t, int64_t>{4, 32}, {64, 128}, {3, 100}}) {
      const int64_t zw = heads * d + 8;  // z: columns of a wider projection
      auto x = RandomBf16(t * heads * d, 2.f), z = RandomBf16(t * zw, 3.f), w = RandomBf16(d);
      Tensor cx = HostF32(x, {t, heads, d}), cz = HostF32(z, {t, zw}), cw = HostF32(w, {d});
      Tensor cout = Tensor::Empty(DType::kF32, {t, heads, d});
      cpu::GatedRmsNorm(cx, HeadCols(cz, zw, 8, heads, d), cw, 1e-6f, cout);
      Tensor gx = Upload(gpu(), x, {t, heads, d}, DType::kBF16), gz = Upload(gpu(), z, {t, zw}, DType::kBF16);
      Tensor gw = Upload(gpu(), w, {d}, DType::kBF16), gout = gpu().Empty(DType::kBF16, {t, heads, d});
      Poison(gpu(), gout);
      gpu().GatedRmsNorm(gx, HeadCols(gz, zw, 8, heads, d), gw, 1e-6f, gout);
      double e = RelError(Download(gpu(), gout), std::vector<float>(cout.ptr<float>(), cout.ptr<float>() + cout.numel()));
      const std::string shape = Dims({t, heads, d});
      Record("GatedRmsNorm", shape, e, kBf16Tol);
      EXPECT_LT(e, kBf16Tol) << shape;
    }
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
