// Gated DeltaNet on the GPU against its CPU twins (kernels/cpu/linear_attention.cc): SigmoidMul,
// CausalConv1d, GatedRmsNorm, and GatedDeltaRule through both of its kernels, the recurrent one
// (decode, short chunks) and the chunked tensor-core one (gated_delta_chunked.cu), each forced
// and in the default split. The sweep: one token, decode batches, prefill and chunks continuing
// a nonzero state, one varlen batch of 1, 63, 64, 65, 200 and 1000 tokens; Qwen3.5's head layout
// (16 q/k heads, 64 value heads, Dk = Dv = 128) and small ones (Dk 32/64, Dv 96); f32 and bf16
// state. Fresh bf16-rounded random inputs, outputs NaN-poisoned before each run.
// CudaPerf.GatedDeltaPrefill and CudaPerf.GatedDeltaDecode print one layer's speed ("gated
// delta prefill:" / "gated delta decode:" lines). Needs a GPU; skips otherwise.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/test_util.h"

namespace corolla::cuda_test {

std::string Dims(std::initializer_list<int64_t> d);  // cuda_kernels_test.cc

namespace {

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

// Which kernel GatedDeltaRule runs, forced through Tuning().gated_delta_chunked_min_tokens:
// every sequence recurrent, the default split (chunked from 64 tokens: both kernels in one
// batch), or every sequence chunked (one token, ragged chunks).
struct DeltaPath {
  const char* name;
  int64_t chunked_min_tokens;  // 0: the process default
};
constexpr DeltaPath kDeltaPaths[] = {{"recurrent", std::numeric_limits<int64_t>::max()}, {"default", 0}, {"chunked", 1}};

// The recurrent state in f32 and in bf16 (--linear-state-dtype bf16: read widened, written back
// rounded once per chunk, on both backends), through each kernel path. Both kernels track the
// f32 twin to near f32 accuracy (the chunked one splits its f32 mma operands into bf16 hi + lo;
// host emulation of its fragments: ~5e-6 relative, outputs before rounding and state). Bounds:
// outputs are rounded to bf16 once (~1.6e-3 relative rms, as the twin's f32 against them), 3e-3;
// the f32 state kF32Tol (measured ~1e-7 recurrent, predicted ~5e-6 chunked); a bf16 state 2e-3
// (where the two backends' f32 sums differ in the last bits, a rounding may go the other way:
// one ulp on a small fraction of the elements, predicted ~2e-4).
TEST_F(CudaKernelTest, GatedDeltaRule) {
  DefaultTuning();  // captured before this test changes Tuning()
  constexpr double kOutTol = 3e-3, kBf16StateTol = 2e-3;
  struct Heads { int64_t hk, hv, dk, dv; };
  auto batches = LinearBatches();
  // Both kernels in one varlen batch: around the chunk (63, 64, 65), several chunks with a
  // ragged end (200, 1000); most continue a nonzero state.
  batches.push_back({{1, 63, 64, 65, 200, 1000}, {5, 40, 0, 64, 130, 7}});
  for (DType state_dtype : {DType::kF32, DType::kBF16})
    for (Heads h : {Heads{2, 4, 32, 32}, Heads{1, 1, 64, 64}, Heads{16, 64, 128, 128}, Heads{2, 2, 128, 96}})
      for (const auto& [q_lens, prefixes] : batches) {
        const int64_t slots = 8;
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
        std::vector<float> ref_state(cst.numel());
        for (int64_t i = 0; i < cst.numel(); ++i)
          ref_state[i] = bf16_state ? ToFloat(cst.ptr<bf16>()[i]) : cst.ptr<float>()[i];
        const std::vector<float> ref_out(cout.ptr<float>(), cout.ptr<float>() + cout.numel());
        Tensor gm = Upload(gpu(), mixed, {t, width}, DType::kBF16), gp = Upload(gpu(), proj, {t, pw}, DType::kBF16);
        Tensor gal = Upload(gpu(), alog, {h.hv}, DType::kF32), gdt = Upload(gpu(), dtb, {h.hv}, DType::kF32);
        Tensor gqs = UploadI32(gpu(), lb.qstart, {lb.num_seqs() + 1}), gsl = UploadI32(gpu(), lb.seq_lens, {lb.num_seqs()});
        Tensor gslots = UploadI32(gpu(), lb.slots, {lb.num_seqs()});
        AttentionBatch gb{gqs, gsl, TensorView(), TensorView(), lb.max_q, 0};
        for (const DeltaPath& path : kDeltaPaths) {
          cuda::Tuning().gated_delta_chunked_min_tokens =
              path.chunked_min_tokens > 0 ? path.chunked_min_tokens : DefaultTuning().gated_delta_chunked_min_tokens;
          Tensor gst = Upload(gpu(), st, sshape, state_dtype);
          Tensor gout = gpu().Empty(DType::kBF16, {t, h.hv, h.dv});
          Poison(gpu(), gout);
          run(&gpu(), gm, gp, gal, gdt, gst, gslots, gb, gout);
          const std::string shape = "Hk" + std::to_string(h.hk) + " Hv" + std::to_string(h.hv) + " Dk" +
                                    std::to_string(h.dk) + " Dv" + std::to_string(h.dv) + " " + lb.Name() +
                                    (bf16_state ? " bf16 state" : "");
          const std::string kernel = std::string("GatedDeltaRule.") + path.name;
          const double state_tol = bf16_state ? kBf16StateTol : kF32Tol;
          const double e = RelError(Download(gpu(), gout), ref_out);
          const double es = RelError(Download(gpu(), gst), ref_state);
          Record(kernel, shape, e, kOutTol);
          Record(kernel + ".state", shape, es, state_tol);
          EXPECT_LT(e, kOutTol) << path.name << " " << shape;
          EXPECT_LT(es, state_tol) << path.name << " " << shape;
        }
        cuda::Tuning() = DefaultTuning();
      }
}

// Qwen3.5-397B-A17B's linear-attention layer (tests/data/configs/qwen3.5-397b-a17b.json: 16 q/k
// heads, 64 value heads, Dk = Dv = 128) on random inputs: q | k | v as columns of one mixed
// buffer and b | a of one projection, as the model passes them; f32 state.
struct DeltaPerfLayer {
  static constexpr int64_t kHk = 16, kHv = 64, kDk = 128, kDv = 128;
  static constexpr int64_t kWidth = 2 * kHk * kDk + kHv * kDv, kProj = 2 * kHv;
  Tensor mixed, proj, a_log, dt_bias, state, out, qs, sl, slots;
  AttentionBatch batch;
  DeltaPerfLayer(Backend& be, cudaStream_t stream, const std::vector<int32_t>& q_lens, int64_t prefix, DType state_dtype) {
    std::vector<int32_t> qstart{0}, seq_lens, slot_ids;
    int max_q = 0;
    for (size_t b = 0; b < q_lens.size(); ++b) {
      qstart.push_back(qstart.back() + q_lens[b]);
      seq_lens.push_back(static_cast<int32_t>(prefix) + q_lens[b]);
      slot_ids.push_back(static_cast<int32_t>(b));
      max_q = std::max(max_q, q_lens[b]);
    }
    const int64_t tokens = qstart.back(), num_seqs = static_cast<int64_t>(q_lens.size());
    mixed = be.Empty(DType::kBF16, {tokens, kWidth});
    proj = be.Empty(DType::kBF16, {tokens, kProj});
    state = be.Empty(state_dtype, {num_seqs, kHv, kDk, kDv});
    out = be.Empty(DType::kBF16, {tokens, kHv, kDv});
    // A 1M-value random block repeated: real sizes without minutes of host RNG.
    static const std::vector<float> block = RandomBf16(1 << 20, 1.f);
    Tensor block_bf16 = Upload(be, block, {1 << 20}, DType::kBF16), block_f32 = Upload(be, block, {1 << 20}, DType::kF32);
    auto fill = [&](const Tensor& t, const Tensor& src) {
      const size_t total = t.numel() * DTypeSize(t.dtype()), piece = src.numel() * DTypeSize(src.dtype());
      for (size_t off = 0; off < total; off += piece)
        cudaMemcpyAsync(static_cast<char*>(t.view().data) + off, src.view().data, std::min(piece, total - off),
                        cudaMemcpyDeviceToDevice, stream);
    };
    fill(mixed, block_bf16);
    fill(proj, block_bf16);
    fill(state, state_dtype == DType::kBF16 ? block_bf16 : block_f32);
    a_log = Upload(be, RandomBf16(kHv, 1.f), {kHv}, DType::kF32);
    dt_bias = Upload(be, RandomBf16(kHv, 1.f), {kHv}, DType::kF32);
    qs = UploadI32(be, qstart, {num_seqs + 1});
    sl = UploadI32(be, seq_lens, {num_seqs});
    slots = UploadI32(be, slot_ids, {num_seqs});
    batch = AttentionBatch{qs, sl, TensorView(), TensorView(), max_q, static_cast<int>(prefix) + max_q};
    be.Synchronize();
  }
  void Run(Backend& be) const {
    be.GatedDeltaRule(HeadCols(mixed, kWidth, 0, kHk, kDk), HeadCols(mixed, kWidth, kHk * kDk, kHk, kDk),
                      HeadCols(mixed, kWidth, 2 * kHk * kDk, kHv, kDv), Cols(proj, kProj, kHv, kHv),
                      Cols(proj, kProj, 0, kHv), a_log, dt_bias, state, slots, batch, out);
  }
};

// One layer's prefill of one fresh sequence, chunked kernel (the default path) against the
// recurrent one and against the published H200 figures of the same shape. FLOPs counted for
// the chunked form at C = 64 per value head and chunk, every product full (no triangular
// savings, none of this kernel's per-column-slice recomputation): K K^T and Q K^T 2 x 2 C^2 Dk,
// K S and Q S 2 x 2 C Dk Dv, the solve and P delta 2 x 2 C^2 Dv, K^T delta 2 C Dk Dv.
TEST(CudaPerf, GatedDeltaPrefill) {
  Backend* gpu_ptr = Gpu();
  if (gpu_ptr == nullptr) GTEST_SKIP() << "no CUDA device";
  Backend& gpu = *gpu_ptr;
  DefaultTuning();
  cudaStream_t stream = static_cast<cuda::CudaBackend&>(gpu).stream();
  constexpr double kPeakTflops = 989.0;  // H200 dense bf16, nominal
  struct Published { int64_t tokens; double flashqla_ms, fla_ms; };
  for (Published pub : {Published{8192, 0.397, 0.814}, Published{32768, 1.521, 3.331}}) {
    DeltaPerfLayer layer(gpu, stream, {static_cast<int32_t>(pub.tokens)}, 0, DType::kF32);
    using L = DeltaPerfLayer;
    const double chunks = static_cast<double>((pub.tokens + 63) / 64), c = 64;
    const double flops = L::kHv * chunks * (4 * c * c * L::kDk + 4 * c * c * L::kDv + 6 * c * L::kDk * L::kDv);
    cuda::Tuning() = DefaultTuning();
    cuda::Tuning().gated_delta_chunked_min_tokens = 64;
    const double chunked_us = MedianUs(stream, [&] { layer.Run(gpu); }, 10);
    cuda::Tuning().gated_delta_chunked_min_tokens = std::numeric_limits<int64_t>::max();
    const double recurrent_us = MedianUs(stream, [&] { layer.Run(gpu); }, 3);
    cuda::Tuning() = DefaultTuning();
    const double tflops = flops / (chunked_us * 1e-6) / 1e12;
    std::printf("gated delta prefill: T %lld Hk %lld Hv %lld D %lld: chunked %.3f ms (%.1f TFLOP/s of %.1f GFLOP = %.1f%% "
                "of %.0f nominal), recurrent %.3f ms (x%.1f); published H200: FlashQLA %.3f ms (chunked at x%.2f), "
                "flash-linear-attention Triton %.3f ms (x%.2f)\n",
                static_cast<long long>(pub.tokens), static_cast<long long>(L::kHk), static_cast<long long>(L::kHv),
                static_cast<long long>(L::kDk), chunked_us / 1e3, tflops, flops / 1e9, 100 * tflops / kPeakTflops,
                kPeakTflops, recurrent_us / 1e3, recurrent_us / chunked_us, pub.flashqla_ms,
                chunked_us / 1e3 / pub.flashqla_ms, pub.fla_ms, chunked_us / 1e3 / pub.fla_ms);
    const std::string shape = "T" + std::to_string(pub.tokens) + " Hv64 D128";
    Record("Perf.gdn_prefill_ms", shape + " chunked", chunked_us / 1e3, 0);
    Record("Perf.gdn_prefill_ms", shape + " recurrent", recurrent_us / 1e3, 0);
    Record("Perf.gdn_prefill_peak%", shape + " chunked", 100 * tflops / kPeakTflops, 0);
  }
}

// One decode step (one token per sequence, continuing its state) of one layer at batch 1 - 256:
// time against the state traffic limit, each sequence's state read and written once
// (Hv Dk Dv x 2 x its dtype's bytes) at the HBM copy rate measured here.
TEST(CudaPerf, GatedDeltaDecode) {
  Backend* gpu_ptr = Gpu();
  if (gpu_ptr == nullptr) GTEST_SKIP() << "no CUDA device";
  Backend& gpu = *gpu_ptr;
  DefaultTuning();
  cudaStream_t stream = static_cast<cuda::CudaBackend&>(gpu).stream();
  double copy_tbps = 0;
  {
    Tensor a = gpu.Empty(DType::kBF16, {int64_t{1} << 29}), b = gpu.Empty(DType::kBF16, {int64_t{1} << 29});
    const double us = MedianUs(stream, [&] { cudaMemcpyAsync(b.view().data, a.view().data, size_t{1} << 30,
                                                             cudaMemcpyDeviceToDevice, stream); }, 10);
    copy_tbps = 2.0 * (size_t{1} << 30) / (us * 1e-6) / 1e12;
  }
  using L = DeltaPerfLayer;
  for (DType state_dtype : {DType::kF32, DType::kBF16})
    for (int32_t batch : {1, 8, 64, 256}) {
      DeltaPerfLayer layer(gpu, stream, std::vector<int32_t>(batch, 1), 1000, state_dtype);
      const double us = MedianUs(stream, [&] { layer.Run(gpu); }, 20);
      const double bytes = 2.0 * batch * L::kHv * L::kDk * L::kDv * DTypeSize(state_dtype);
      const double limit_us = bytes / (copy_tbps * 1e12) * 1e6;
      std::printf("gated delta decode: B %d %s state: %.1f us, state traffic %.1f MB -> %.2f TB/s = %.1f%% of the "
                  "%.2f TB/s copy rate (limit %.1f us)\n",
                  batch, state_dtype == DType::kBF16 ? "bf16" : "f32", us, bytes / 1e6, bytes / (us * 1e-6) / 1e12,
                  100 * limit_us / us, copy_tbps, limit_us);
      const std::string shape = "B" + std::to_string(batch) + (state_dtype == DType::kBF16 ? " bf16" : " f32") + " state";
      Record("Perf.gdn_decode_us", shape, us, 0);
      Record("Perf.gdn_decode_limit%", shape, 100 * limit_us / us, 0);
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

}  // namespace
}  // namespace corolla::cuda_test
