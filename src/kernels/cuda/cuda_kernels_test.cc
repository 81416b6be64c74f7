// Every CUDA kernel against its CPU twin (kernels/cpu/ops.h) over a shape sweep: one token,
// many, lengths off the tile, head dims 32/64/128/256, chunked prefill over a prefix, experts
// with zero or all tokens (attention and KvWrite: attention_kernel_test.cc; MoeExperts:
// moe_kernel_test.cc; Gated DeltaNet: linear_attention_kernel_test.cc). Inputs are fresh bf16-rounded randoms, outputs are
// NaN-poisoned first; bf16 outputs pass at ||out - ref|| / ||ref|| < 1e-2, f32 ones tighter.
// Runs only on a machine with a GPU (skips otherwise); scripts/gpu_run.sh runs it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

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

// Rope alone over strided head views, as the models call it: DeepSeek's (128 q heads' rope dims at
// column 128 of 192-wide heads, the latent's one k head at column 512 of a 576-wide row, adjacent
// pairs, YaRN), more heads than a warp takes (4), rotary widths 64 / 128 / 256 in neox and
// interleaved form, rows only 2-byte aligned, partial rotary. Positions up to 8k.
TEST_F(CudaKernelTest, RopeStridedHeads) {
  // q: [T, hq, d] at column q_col of rows q_hs apart a head, q_width a token (k likewise).
  struct Case {
    int64_t hq, hk, d, rot, q_width, q_hs, q_col, k_width, k_hs, k_col;
    bool interleaved;
    float yarn;
  };
  const Case cases[] = {
      {128, 1, 64, 64, 128 * 192, 192, 128, 576, 64, 512, true, 40.f},  // DeepSeek-V3's prefill
      {40, 3, 128, 128, 40 * 128, 128, 0, 3 * 128, 128, 0, false, 1.f},
      {40, 3, 128, 128, 40 * 128, 128, 0, 3 * 128, 128, 0, true, 1.f},
      {37, 2, 64, 64, 37 * 64 + 1, 64, 1, 2 * 64 + 1, 64, 1, true, 1.f},  // 2-byte aligned rows
      {5, 2, 256, 256, 5 * 256, 256, 0, 2 * 256, 256, 0, false, 1.f},
      {5, 2, 256, 256, 5 * 256, 256, 0, 2 * 256, 256, 0, true, 1.f},
      {9, 1, 256, 64, 9 * 256, 256, 0, 256, 256, 0, false, 1.f},  // partial rotary
  };
  for (const Case& c : cases)
    for (int64_t tokens : {1, 77}) {
      auto q_host = RandomBf16(tokens * c.q_width, 2.f),
           k_host = RandomBf16(tokens * c.k_width, 2.f);
      std::vector<int32_t> pos(tokens);
      for (auto& p : pos) p = static_cast<int32_t>(Rng()() % 8192);
      RopeParams rp{static_cast<int>(c.rot), 10000.f, c.interleaved};
      if (c.yarn > 1.f) {
        rp.yarn_factor = c.yarn;
        rp.yarn_original_max_positions = 4096;
        rp.attention_factor = 1.37f;
      }
      auto view = [&](const Tensor& t, int64_t heads, int64_t width, int64_t hs, int64_t col) {
        TensorView v = t.view();
        v.data = static_cast<char*>(v.data) + col * DTypeSize(v.dtype);
        v.shape = {tokens, heads, c.d};
        v.strides = {width, hs, 1, 0};
        return v;
      };
      Tensor cq = HostF32(q_host, {tokens, c.q_width}), ck = HostF32(k_host, {tokens, c.k_width});
      Tensor gq = Upload(gpu(), q_host, {tokens, c.q_width}, DType::kBF16);
      Tensor gk = Upload(gpu(), k_host, {tokens, c.k_width}, DType::kBF16);
      Tensor cpos = HostI32(pos, {tokens}), gpos = UploadI32(gpu(), pos, {tokens});
      cpu::Rope(view(cq, c.hq, c.q_width, c.q_hs, c.q_col),
                view(ck, c.hk, c.k_width, c.k_hs, c.k_col), cpos, rp);
      gpu().Rope(view(gq, c.hq, c.q_width, c.q_hs, c.q_col),
                 view(gk, c.hk, c.k_width, c.k_hs, c.k_col), gpos, rp);
      const std::string shape = "T" + std::to_string(tokens) + " hq" + std::to_string(c.hq) +
                                " hk" + std::to_string(c.hk) + " D" + std::to_string(c.d) + " rot" +
                                std::to_string(c.rot) + (c.interleaved ? " interleaved" : " neox") +
                                (c.q_col % 2 ? " 2-byte rows" : "");
      std::vector<float> rq(cq.ptr<float>(), cq.ptr<float>() + tokens * c.q_width);
      std::vector<float> rk(ck.ptr<float>(), ck.ptr<float>() + tokens * c.k_width);
      const double e =
          std::max(RelError(Download(gpu(), gq), rq), RelError(Download(gpu(), gk), rk));
      Record("Rope", shape, e, kBf16Tol);
      EXPECT_LT(e, kBf16Tol) << shape;
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

// Many exact ties (logits from {-1, 0, 1, 2}): the picks must follow the CPU's order (ties to the
// lower expert id) on both RouteToken paths (registers for softmax without bias or groups: E 128
// and 512; the shared-memory scans: E 1024).
TEST_F(CudaKernelTest, MoeRouteTies) {
  for (int experts : {128, 512, 1024})
    for (int k : {8, 10}) {
      const int64_t tokens = 3;
      std::vector<float> logits(tokens * experts);
      for (float& l : logits) l = static_cast<float>(static_cast<int>(Rng()() % 4) - 1);
      Tensor cl = HostF32(logits, {tokens, experts});
      Tensor cids = Tensor::Empty(DType::kI32, {tokens, k}), cw = Tensor::Empty(DType::kF32, {tokens, k});
      cpu::MoeRoute(cl, {k, true}, cids, cw);
      Tensor gl = Upload(gpu(), logits, {tokens, experts}, DType::kF32);
      Tensor gids = gpu().Empty(DType::kI32, {tokens, k}), gw = gpu().Empty(DType::kF32, {tokens, k});
      Poison(gpu(), gw);
      gpu().MoeRoute(gl, {k, true}, gids, gw);
      auto ids = DownloadI32(gpu(), gids);
      int mismatches = 0;
      for (int64_t i = 0; i < tokens * k; ++i) mismatches += ids[i] != cids.ptr<int32_t>()[i];
      const double e = RelError(Download(gpu(), gw), std::vector<float>(cw.ptr<float>(), cw.ptr<float>() + tokens * k));
      const std::string shape = Dims({tokens, experts}) + " k" + std::to_string(k) + " ties";
      Record("MoeRoute.id_mismatches", shape, mismatches, 0);
      EXPECT_EQ(mismatches, 0) << shape;
      EXPECT_LT(e, kF32Tol) << shape;
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

// Rows without a top_k sort the whole vocabulary: one radix sort over every row's (row, key)
// bits, so 300 rows sort on 41 bits.
TEST_F(CudaKernelTest, Sample) {
  for (auto [vocab, batch] : {std::pair<int64_t, int64_t>{1000, 16}, {151936, 16}, {1000, 300}}) {
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
    Record("Sample.mismatches",
           "B" + std::to_string(batch) + " V" + std::to_string(vocab) + " x4 steps", mismatches, 0);
  }
}

// Greedy rows take the argmax over many CTAs (slices of 2048 logits, then one CTA a row): the
// largest value with ties to the lowest id, across slices too; NaN never wins; a row without a
// finite or +inf logit gives 0. f32 and bf16 logits, vocabularies around a slice's edges.
TEST_F(CudaKernelTest, SampleGreedy) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int64_t vocab : {7, 1000, 2048, 2049, 151936}) {
      for (int64_t batch : {1, 6}) {
        std::vector<float> logits(batch * vocab);
        std::normal_distribution<float> nd(0.f, 3.f);
        for (auto& l : logits) l = nd(Rng());
        auto row = [&](int64_t b) { return logits.data() + b * vocab; };
        if (batch > 1) {
          row(1)[vocab / 3] = row(1)[vocab - 1] = 50.f;  // a tie, in different slices when long
          row(1)[vocab / 2] = NAN;
          for (int64_t i = 0; i < vocab; ++i) row(2)[i] = i % 2 ? -INFINITY : NAN;  // no winner: 0
          row(3)[vocab - 1] = 60.f;                                                 // the last id
          row(4)[vocab / 2] = row(4)[vocab / 4] = INFINITY;
          for (int64_t i = 0; i < vocab; ++i) row(5)[i] = 1.f;  // all tied: id 0
        }
        if (dt == DType::kBF16)
          for (auto& l : logits) l = ToFloat(ToBf16(l));
        std::vector<SamplingParams> params(batch);
        for (auto& p : params) p.temperature = 0.f;  // greedy
        std::vector<uint64_t> steps(batch, 3);
        std::vector<int32_t> ref(batch), got(batch, -7);
        cpu::SampleBatch(logits.data(), batch, vocab, params.data(), steps.data(), ref.data());
        Tensor g = Upload(gpu(), logits, {batch, vocab}, dt);
        gpu().Sample(g, params.data(), steps.data(), got.data());
        const std::string shape = std::string(dt == DType::kF32 ? "f32" : "bf16") + " B" +
                                  std::to_string(batch) + " V" + std::to_string(vocab);
        int mismatches = 0;
        for (int64_t b = 0; b < batch; ++b) {
          mismatches += got[b] != ref[b];
          EXPECT_EQ(got[b], ref[b]) << shape << " row " << b;
        }
        Record("SampleGreedy", shape, mismatches, 0);
      }
    }
  }
}

// Steps whose sampled rows all name a top_k <= 256 take the top-k selection (chunks of 2048
// sorted in shared memory, rounds until one CTA holds the row) instead of the full sort: the
// same tokens as the CPU sampler and as the sort path (Tuning().sample_top_k_select off), with
// ties at the K-th entry, fewer positive weights than K, NaN, +-inf, a greedy row beside
// sampled ones, and vocabularies around the chunks' edges.
TEST_F(CudaKernelTest, SampleTopK) {
  const bool select_default = cuda::Tuning().sample_top_k_select;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int64_t vocab : {7, 1000, 2048, 2049, 4500, 151936}) {
      for (int max_k : {20, 256}) {  // K: two rounds over 151936 logits, or four
        const int64_t batch = 8;
        std::vector<float> logits(batch * vocab);
        std::normal_distribution<float> nd(0.f, 3.f);
        for (auto& l : logits) l = nd(Rng());
        auto row = [&](int64_t b) { return logits.data() + b * vocab; };
        for (int64_t i = 0; i < vocab; ++i) row(2)[i] = std::round(row(2)[i]);  // ties everywhere
        for (int64_t i = 0; i < vocab; ++i)
          row(3)[i] = i % 97 == 5 ? row(3)[i] : -INFINITY;  // few finite
        row(3)[vocab / 2] = NAN;
        for (int64_t i = 0; i < vocab; ++i) row(4)[i] = -INFINITY;  // nothing to sample: 0
        row(5)[vocab / 3] = row(5)[vocab - 1] = INFINITY;
        row(6)[0] = row(6)[vocab - 1] = 40.f;  // a tie at the max, in different chunks when long
        if (dt == DType::kBF16)
          for (auto& l : logits) l = ToFloat(ToBf16(l));
        std::vector<SamplingParams> params(batch);
        const int top_k[batch] = {20, 1, 20, max_k == 20 ? 5 : 50, 20, 3, max_k, 20};
        for (int64_t b = 0; b < batch; ++b) {
          SamplingParams& p = params[b];
          p.seed = 77 + b;
          p.temperature = b == 7 ? 0.f : 0.6f + 0.1f * static_cast<float>(b);  // row 7 greedy
          p.top_k = top_k[b];
          if (b % 2 == 0) p.top_p = 0.95f;
          if (b == 6) p.min_p = 0.02f;
        }
        Tensor g = Upload(gpu(), logits, {batch, vocab}, dt);
        const std::string shape = std::string(dt == DType::kF32 ? "f32" : "bf16") + " B8 V" +
                                  std::to_string(vocab) + " K" + std::to_string(max_k);
        int mismatches = 0;
        std::vector<uint64_t> steps(batch);
        for (int rep = 0; rep < 6; ++rep) {  // several draws
          for (int64_t b = 0; b < batch; ++b) steps[b] = 11 * rep + b;
          std::vector<int32_t> ref(batch), sel(batch, -7), sorted(batch, -7);
          cpu::SampleBatch(logits.data(), batch, vocab, params.data(), steps.data(), ref.data());
          cuda::Tuning().sample_top_k_select = true;
          gpu().Sample(g, params.data(), steps.data(), sel.data());
          cuda::Tuning().sample_top_k_select = false;
          gpu().Sample(g, params.data(), steps.data(), sorted.data());
          for (int64_t b = 0; b < batch; ++b) {
            mismatches += sel[b] != ref[b];
            EXPECT_EQ(sel[b], ref[b]) << shape << " row " << b << " step " << steps[b];
            EXPECT_EQ(sel[b], sorted[b]) << shape << " row " << b << " step " << steps[b];
          }
        }
        Record("SampleTopK.mismatches", shape + " x6 steps", mismatches, 0);
      }
    }
  }
  cuda::Tuning().sample_top_k_select = select_default;
}

// Steps whose sampled rows name no top_k take the nucleus path (sampling_nucleus.cuh: a weight
// histogram, then only the bins that hold the cut and the draw sorted): the same tokens as the
// CPU sampler and as the full sort (Tuning().sample_nucleus off), with top-p, min-p, both, the
// temperature alone, top_p 0, ties, few finite entries, NaN, +-inf, a greedy row beside sampled
// ones, flat rows, and rows all equal (more entries in a bin than one in-block sort takes: the
// one-CTA sort in global memory).
TEST_F(CudaKernelTest, SampleNucleus) {
  const bool nucleus_default = cuda::Tuning().sample_nucleus;
  struct Case {
    DType dtype;
    int64_t vocab, batch;
  };
  std::vector<Case> cases;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int64_t vocab : {7, 1000, 4097, 129280, 151936}) cases.push_back({dt, vocab, 12});
  cases.push_back({DType::kF32, 151936, 64});
  for (const Case& c : cases) {
    const int64_t vocab = c.vocab, batch = c.batch;
    std::vector<float> logits(batch * vocab);
    std::normal_distribution<float> nd(0.f, 3.f);
    for (auto& l : logits) l = nd(Rng());
    auto row = [&](int64_t b) { return logits.data() + b * vocab; };
    std::vector<SamplingParams> params(batch);
    for (int64_t b = 0; b < batch; ++b) {
      SamplingParams& p = params[b];
      p.seed = 31 + b;
      float* r = row(b);
      switch (b % 12) {
        case 0:
          p.temperature = 0.f;
          break;  // greedy
        case 1:
          p.temperature = 1.f;
          break;  // the temperature alone
        case 2:
          p.temperature = 1.f;
          p.top_p = 0.9f;
          break;
        case 3:
          p.temperature = 0.6f;
          p.top_p = 0.95f;
          for (int64_t i = 0; i < vocab; ++i) r[i] = std::round(r[i]);  // ties everywhere
          break;
        case 4:
          p.temperature = 0.8f;
          p.top_p = 0.5f;
          p.min_p = 0.1f;
          break;
        case 5:
          p.temperature = 1.2f;
          p.min_p = 0.05f;
          break;
        case 6:
          p.temperature = 1.f;
          p.top_p = 0.9f;
          for (int64_t i = 0; i < vocab; ++i) r[i] = i % 97 == 5 ? r[i] : -INFINITY;  // few finite
          r[vocab / 2] = NAN;
          break;
        case 7:
          p.temperature = 0.7f;
          p.top_p = 0.9f;
          for (int64_t i = 0; i < vocab; ++i) r[i] = -INFINITY;  // nothing to sample: 0
          break;
        case 8:
          p.temperature = 1.f;
          p.top_p = 0.95f;
          r[vocab / 3] = r[vocab - 1] = INFINITY;
          break;
        case 9:
          p.temperature = 1.f;
          p.top_p = 0.9f;
          for (int64_t i = 0; i < vocab; ++i) r[i] = 2.5f;  // all equal: one bin holds the row
          break;
        case 10:
          p.temperature = 2.f;
          p.top_p = 0.99f;
          for (int64_t i = 0; i < vocab; ++i) r[i] *= 0.05f;  // flat
          break;
        case 11:
          p.temperature = 0.5f;
          p.top_p = 0.f;
          break;  // only the first token
      }
    }
    if (c.dtype == DType::kBF16)
      for (auto& l : logits) l = ToFloat(ToBf16(l));
    Tensor g = Upload(gpu(), logits, {batch, vocab}, c.dtype);
    const std::string shape = std::string(c.dtype == DType::kF32 ? "f32" : "bf16") + " B" +
                              std::to_string(batch) + " V" + std::to_string(vocab);
    int mismatches = 0;
    std::vector<uint64_t> steps(batch);
    for (int rep = 0; rep < 6; ++rep) {  // several draws
      for (int64_t b = 0; b < batch; ++b) steps[b] = 13 * rep + b;
      std::vector<int32_t> ref(batch), got(batch, -7), sorted(batch, -7);
      cpu::SampleBatch(logits.data(), batch, vocab, params.data(), steps.data(), ref.data());
      cuda::Tuning().sample_nucleus = true;
      gpu().Sample(g, params.data(), steps.data(), got.data());
      cuda::Tuning().sample_nucleus = false;
      gpu().Sample(g, params.data(), steps.data(), sorted.data());
      for (int64_t b = 0; b < batch; ++b) {
        mismatches += got[b] != ref[b];
        EXPECT_EQ(got[b], ref[b]) << shape << " row " << b << " (mode " << b % 12 << ") step "
                                  << steps[b];
        EXPECT_EQ(got[b], sorted[b]) << shape << " row " << b << " step " << steps[b];
      }
    }
    Record("SampleNucleus.mismatches", shape + " x6 steps", mismatches, 0);
  }
  cuda::Tuning().sample_nucleus = nucleus_default;
}

// The sampler's latency a call (upload, kernels, the ids back; wall clock, median of 15) at
// batch 1 and 64 over Qwen3's 151936 logits, with the nucleus path and with the full sort it
// replaces (Tuning().sample_nucleus), beside greedy and top_k 20 (the selection). Two rows:
// logits of std 0.9 (what Qwen3-30B-A3B's random weights give: flat, ~500 entries a bin) and of
// std 3 (peaked).
TEST(CudaPerf, Sample) {
  if (Gpu() == nullptr) GTEST_SKIP() << "no CUDA device";
  Backend& gpu = *Gpu();
  const int64_t vocab = 151936;
  struct Mode {
    const char* name;
    float temperature, top_p, min_p;
    int top_k;
  };
  const Mode modes[] = {{"greedy", 0.f, 1.f, 0.f, 0},
                        {"t0.6 top_k 20 top_p 0.95", 0.6f, 0.95f, 0.f, 20},
                        {"t0.7 top_p 0.9", 0.7f, 0.9f, 0.f, 0},
                        {"t1", 1.f, 1.f, 0.f, 0},
                        {"t1.2 min_p 0.05", 1.2f, 1.f, 0.05f, 0}};
  for (const float sd : {0.9f, 3.f}) {
    for (const int64_t batch : {1, 64}) {
      std::vector<float> logits(batch * vocab);
      std::normal_distribution<float> nd(0.f, sd);
      for (auto& l : logits) l = nd(Rng());
      Tensor g = Upload(gpu, logits, {batch, vocab}, DType::kF32);
      std::vector<int32_t> got(batch);
      std::vector<uint64_t> steps(batch, 0);
      for (const Mode& m : modes) {
        std::vector<SamplingParams> params(batch);
        for (int64_t b = 0; b < batch; ++b)
          params[b] = {m.temperature, m.top_k, m.top_p, m.min_p, static_cast<uint64_t>(b)};
        for (const bool nucleus : {true, false}) {
          if (!nucleus && (m.temperature == 0.f || m.top_k > 0)) continue;  // the same path
          cuda::Tuning().sample_nucleus = nucleus;
          std::vector<double> us;
          for (int rep = 0; rep < 18; ++rep) {
            for (auto& st : steps) ++st;
            const auto t0 = std::chrono::steady_clock::now();
            gpu.Sample(g, params.data(), steps.data(), got.data());
            const auto t1 = std::chrono::steady_clock::now();
            if (rep >= 3) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
          }
          std::sort(us.begin(), us.end());
          std::printf("sample perf: sd %.1f batch %3lld %-26s %-9s %8.1f us\n", sd,
                      static_cast<long long>(batch), m.name,
                      m.temperature == 0.f || m.top_k > 0 ? ""
                      : nucleus                           ? "nucleus"
                                                          : "sort",
                      us[us.size() / 2]);
        }
      }
    }
  }
  cuda::Tuning() = DefaultTuning();
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
