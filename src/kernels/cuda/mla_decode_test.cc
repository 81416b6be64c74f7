// MLA decode on the GPU against the CPU twin (cpu::Attention over the same latent cache), and
// BatchedLinear against cpu::BatchedLinear. MLA decode: the tensor-core kernel of mla_decode.cu
// (checked to be the one routed to) over batches 1, 3, 32, contexts 1 to 5000 mixed within a
// batch, 16 and 128 heads (and the test fixture's 48/32 dims), block sizes 16, 64 and 5; every
// split setting (planned, none, 3, as many as tiles) with exact and loose host hints; the SIMT
// kernel on the same inputs as a reference row. Fresh bf16-rounded random inputs, outputs
// NaN-poisoned before each run, ||out - ref|| / ||ref|| < kBf16Tol. CudaPerf.MlaDecode prints
// time and KV bytes / time at 128 heads ("mla decode perf:" lines). Needs a GPU; skips otherwise.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/test_util.h"

namespace corolla::cuda_test {
namespace {

struct MlaCase {
  int heads;
  std::vector<int> seq_lens;  // context of each sequence, this step's token included
  int block_size = 16;
  int dk = 576, dv = 512;
};

std::string MlaShape(const MlaCase& c) {
  std::string s = "D" + std::to_string(c.dk) + "/" + std::to_string(c.dv) + " H" + std::to_string(c.heads) + " bs" +
                  std::to_string(c.block_size) + " B" + std::to_string(c.seq_lens.size()) + " ctx[";
  for (size_t b = 0; b < std::min<size_t>(c.seq_lens.size(), 5); ++b)
    s += std::to_string(c.seq_lens[b]) + (b + 1 < c.seq_lens.size() ? "," : "]");
  if (c.seq_lens.size() > 5) s += "..]";
  return s;
}

void RunMlaDecode(Backend& gpu, const MlaCase& c) {
  const int num_seqs = static_cast<int>(c.seq_lens.size()), bs = c.block_size, hq = c.heads;
  const int64_t dk = c.dk, dv = c.dv;
  std::vector<int32_t> qstart(num_seqs + 1), seq_lens(c.seq_lens.begin(), c.seq_lens.end());
  std::iota(qstart.begin(), qstart.end(), 0);  // one token per sequence
  int max_blocks = 1, total_blocks = 0, max_len = 0;
  for (int len : seq_lens) {
    max_blocks = std::max(max_blocks, (len + bs - 1) / bs);
    total_blocks += (len + bs - 1) / bs;
    max_len = std::max(max_len, len);
  }
  const int num_blocks = total_blocks + 2;
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), Rng());  // scrambled physical blocks
  std::vector<int32_t> tables(static_cast<size_t>(num_seqs) * max_blocks, 0), slots;
  int next = 0;
  for (int b = 0; b < num_seqs; ++b) {
    for (int j = 0; j < (seq_lens[b] + bs - 1) / bs; ++j) tables[b * max_blocks + j] = perm[next++];
    const int p = seq_lens[b] - 1;
    slots.push_back(tables[b * max_blocks + p / bs] * bs + p % bs);
  }
  // The cache already holds every latent (this step's included): KvWrite is tested elsewhere.
  const Shape cshape{num_blocks, 1, bs, dk};
  const auto cache = RandomBf16(cshape.numel());
  const auto q = RandomBf16(int64_t{num_seqs} * hq * dk, 2.f);
  const float scale = 1.f / std::sqrt(192.f);  // DeepSeek-V3's (qk_nope + rope)^-1/2

  Tensor ccache = HostF32(cache, cshape), cq = HostF32(q, {num_seqs, hq, dk});
  Tensor cqs = HostI32(qstart, {num_seqs + 1}), csl = HostI32(seq_lens, {num_seqs});
  Tensor ctab = HostI32(tables, {num_seqs, max_blocks}), cslot = HostI32(slots, {num_seqs});
  Tensor cout = Tensor::Empty(DType::kF32, {num_seqs, hq, dv});
  cpu::Attention(cq, KvCacheView{ccache, ccache}, AttentionBatch{cqs, csl, ctab, cslot, 1, max_len}, scale, cout);
  const std::vector<float> ref(cout.ptr<float>(), cout.ptr<float>() + cout.numel());

  Tensor gcache = Upload(gpu, cache, cshape, DType::kBF16), gq = Upload(gpu, q, {num_seqs, hq, dk}, DType::kBF16);
  Tensor gqs = UploadI32(gpu, qstart, {num_seqs + 1}), gsl = UploadI32(gpu, seq_lens, {num_seqs});
  Tensor gtab = UploadI32(gpu, tables, {num_seqs, max_blocks}), gslot = UploadI32(gpu, slots, {num_seqs});
  const KvCacheView gkv{gcache, gcache};
  const std::string shape = MlaShape(c);
  double worst = 0;
  for (int splits : {0, 1, 3, 1 << 20})
    for (bool loose : {false, true}) {
      cuda::Tuning().mla_decode_splits = splits;
      // Loose: a context bound past every sequence, as under CUDA-graph replay.
      AttentionBatch gb{gqs, gsl, gtab, gslot, 1, loose ? 2 * max_len + 37 : max_len};
      Tensor gout = gpu.Empty(DType::kBF16, {num_seqs, hq, dv});
      Poison(gpu, gout);
      ASSERT_TRUE(cuda::MlaDecodeServes(gq, gkv, gb, gout)) << shape;
      gpu.Attention(gq, gkv, gb, scale, gout);
      const double e = RelError(Download(gpu, gout), ref);
      worst = std::max(worst, e);
      EXPECT_LT(e, kBf16Tol) << shape << " splits " << splits << (loose ? " loose hints" : "");
    }
  Record("Attention.mla_decode", shape + " mma", worst, kBf16Tol);
  // The SIMT kernel on the same inputs (the path MLA decode took before mla_decode.cu).
  cuda::Tuning() = DefaultTuning();
  cuda::Tuning().attention_mma = false;
  Tensor gout = gpu.Empty(DType::kBF16, {num_seqs, hq, dv});
  Poison(gpu, gout);
  AttentionBatch gb{gqs, gsl, gtab, gslot, 1, max_len};
  EXPECT_FALSE(cuda::MlaDecodeServes(gq, gkv, gb, gout));
  gpu.Attention(gq, gkv, gb, scale, gout);
  const double e_simt = RelError(Download(gpu, gout), ref);
  Record("Attention.mla_decode", shape + " simt", e_simt, kBf16Tol);
  EXPECT_LT(e_simt, kBf16Tol) << shape << " simt";
  cuda::Tuning() = DefaultTuning();
}

}  // namespace

TEST_F(CudaKernelTest, MlaDecode) {
  DefaultTuning();  // captured before the sweep changes Tuning()
  for (int heads : {16, 128}) {
    for (int ctx : {1, 100, 1000, 5000}) RunMlaDecode(gpu(), {heads, {ctx}});   // batch 1
    RunMlaDecode(gpu(), {heads, {5000, 1, 100}});                                 // batch 3, mixed
    std::vector<int> lens(32);
    for (int b = 0; b < 32; ++b) lens[b] = b % 8 == 0 ? 5000 : b % 4 == 1 ? 1 : 37 + (b * 211) % 1000;
    RunMlaDecode(gpu(), {heads, lens});                                           // batch 32
  }
  // Block sizes other than 16: 64 (the latent rows of a 32-key tile in one block), 5 (division
  // addressing, tiles across blocks); head counts off the 16/64-row tiles.
  for (int bs : {64, 5}) {
    RunMlaDecode(gpu(), {128, {1000, 33, 1}, bs});
    RunMlaDecode(gpu(), {16, {777, 2}, bs});
  }
  RunMlaDecode(gpu(), {72, {300, 1}});  // a second, mostly empty 64-head tile
  RunMlaDecode(gpu(), {40, {65, 500}});  // 16-head tiles, the last one half empty
  // The test fixture's dims (kv_lora 32 + rope 16), which the model tests decode through.
  for (int heads : {4, 16, 128}) RunMlaDecode(gpu(), {heads, {1, 16, 300}, 16, 48, 32});
}

// BatchedLinear on per-head column views of a fused row, as MLA's absorbed GEMMs use it:
// x = q_nope [T, H, nope] inside q [T, H, nope + rope], w [H, N, nope], out [T, H, N] inside a
// wider row; and the second form, x [T, H, K] contiguous, out [T, H, v] contiguous.
TEST_F(CudaKernelTest, BatchedLinear) {
  struct Case { int64_t tokens, heads, k, n, x_stride, out_stride; };
  // x_stride / out_stride: per-head widths of the fused rows the views sit in (k / n: packed).
  for (Case c : {Case{1, 128, 128, 512, 192, 576}, Case{5, 128, 128, 512, 192, 576}, Case{64, 16, 128, 512, 192, 576},
                 Case{1, 128, 512, 128, 512, 128}, Case{5, 16, 512, 128, 512, 128}, Case{64, 128, 512, 128, 512, 128},
                 Case{3, 4, 16, 32, 24, 48}, Case{7, 4, 32, 16, 32, 16}}) {
    const int64_t t = c.tokens, h = c.heads;
    const auto x = RandomBf16(t * h * c.x_stride), w = RandomBf16(h * c.n * c.k);
    auto views = [&](const TensorView& xt, const TensorView& ot) {
      TensorView xv = xt, ov = ot;
      xv.shape = {t, h, c.k};
      xv.strides = {h * c.x_stride, c.x_stride, 1, 0};
      ov.shape = {t, h, c.n};
      ov.strides = {h * c.out_stride, c.out_stride, 1, 0};
      return std::pair{xv, ov};
    };
    Tensor cx = HostF32(x, {t, h * c.x_stride}), cw = HostF32(w, {h, c.n, c.k});
    Tensor cout = Tensor::Zeros(DType::kF32, {t, h * c.out_stride});
    auto [cxv, cov] = views(cx, cout);
    cpu::BatchedLinear(cxv, cw, cov);
    Tensor gx = Upload(gpu(), x, {t, h * c.x_stride}, DType::kBF16), gw = Upload(gpu(), w, {h, c.n, c.k}, DType::kBF16);
    Tensor gout = gpu().Empty(DType::kBF16, {t, h * c.out_stride});
    Poison(gpu(), gout);
    auto [gxv, gov] = views(gx, gout);
    gpu().BatchedLinear(gxv, gw, gov);
    // Compare the written columns; the rest of each row must keep its poison (NaN).
    const std::vector<float> got = Download(gpu(), gout);
    std::vector<float> got_cols, ref_cols;
    bool outside_untouched = true;
    for (int64_t i = 0; i < t * h * c.out_stride; ++i) {
      if (i % c.out_stride < c.n) {
        got_cols.push_back(got[i]);
        ref_cols.push_back(cout.ptr<float>()[i]);
      } else {
        outside_untouched = outside_untouched && std::isnan(got[i]);
      }
    }
    const double e = RelError(got_cols, ref_cols);
    const std::string shape = "T" + std::to_string(t) + " B" + std::to_string(h) + " " + std::to_string(c.k) + "->" +
                              std::to_string(c.n) + " x stride " + std::to_string(c.x_stride) + " out stride " +
                              std::to_string(c.out_stride);
    Record("BatchedLinear", shape, e, kBf16Tol);
    EXPECT_LT(e, kBf16Tol) << shape;
    EXPECT_TRUE(outside_untouched) << shape << ": wrote outside its columns";
  }
}

// MLA decode at DeepSeek-V3's shape (128 heads, latent 576 = 512 + 64 rope, block size 16):
// batch 1 / 32 / 128 x context 1024 / 4096. Time (median of 20), latent bytes / time against the
// HBM copy rate measured here, and TFLOP/s (2 x 128 x (576 + 512) flops per head and key)
// against an 8192^3 bf16 matmul; the SIMT kernel on the same batch for comparison.
TEST(CudaPerf, MlaDecode) {
  Backend* gpu_ptr = Gpu();
  if (gpu_ptr == nullptr) GTEST_SKIP() << "no CUDA device";
  Backend& gpu = *gpu_ptr;
  DefaultTuning();
  cudaStream_t stream = static_cast<cuda::CudaBackend&>(gpu).stream();
  static const std::vector<float> block = RandomBf16(1 << 20, 1.f);
  Tensor block_dev = Upload(gpu, block, {1 << 20}, DType::kBF16);
  auto fill = [&](const Tensor& t) {  // a 1M-value random block repeated
    const size_t total = t.numel() * sizeof(uint16_t), piece = block.size() * sizeof(uint16_t);
    for (size_t off = 0; off < total; off += piece)
      cudaMemcpyAsync(static_cast<char*>(t.view().data) + off, block_dev.view().data, std::min(piece, total - off),
                      cudaMemcpyDeviceToDevice, stream);
  };
  double copy_gbps = 0, matmul_tflops = 0;
  {
    Tensor a = gpu.Empty(DType::kBF16, {int64_t{1} << 29}), b = gpu.Empty(DType::kBF16, {int64_t{1} << 29});
    const double us = MedianUs(stream, [&] { cudaMemcpyAsync(b.view().data, a.view().data, size_t{1} << 30,
                                                             cudaMemcpyDeviceToDevice, stream); }, 10);
    copy_gbps = 2.0 * (size_t{1} << 30) / (us * 1e-6) / 1e9;
  }
  {
    const int64_t n = 8192;
    Tensor x = gpu.Empty(DType::kBF16, {n, n}), w = gpu.Empty(DType::kBF16, {n, n}), y = gpu.Empty(DType::kBF16, {n, n});
    fill(x);
    fill(w);
    const double us = MedianUs(stream, [&] { gpu.Linear(x, w, y); }, 10);
    matmul_tflops = 2.0 * n * n * n / (us * 1e-6) / 1e12;
  }
  std::printf("mla decode perf: limits: HBM copy %.0f GB/s (read + write), bf16 matmul 8192^3 %.0f TFLOP/s\n",
              copy_gbps, matmul_tflops);
  const int64_t hq = 128, dk = 576, dv = 512, bs = 16;
  const float scale = 1.f / std::sqrt(192.f);
  for (int64_t ctx : {1024, 4096})
    for (int64_t num_seqs : {1, 32, 128}) {
      const int64_t blocks_per_seq = (ctx + bs - 1) / bs, num_blocks = num_seqs * blocks_per_seq;
      Tensor q = gpu.Empty(DType::kBF16, {num_seqs, hq, dk}), out = gpu.Empty(DType::kBF16, {num_seqs, hq, dv});
      Tensor cache = gpu.Empty(DType::kBF16, {num_blocks, 1, bs, dk});
      fill(q);
      fill(cache);
      std::vector<int32_t> perm(num_blocks), qs(num_seqs + 1), sl(num_seqs, static_cast<int32_t>(ctx)), slots;
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), Rng());
      std::iota(qs.begin(), qs.end(), 0);
      for (int64_t b = 0; b < num_seqs; ++b)
        slots.push_back(static_cast<int32_t>(perm[b * blocks_per_seq + (ctx - 1) / bs] * bs + (ctx - 1) % bs));
      Tensor gqs = UploadI32(gpu, qs, {num_seqs + 1}), gsl = UploadI32(gpu, sl, {num_seqs});
      Tensor gtab = UploadI32(gpu, perm, {num_seqs, blocks_per_seq}), gslot = UploadI32(gpu, slots, {num_seqs});
      AttentionBatch batch{gqs, gsl, gtab, gslot, 1, static_cast<int>(ctx)};
      const KvCacheView kv{cache, cache};
      const double bytes = static_cast<double>(num_seqs) * ctx * dk * sizeof(uint16_t);
      const double flops = 2.0 * num_seqs * hq * ctx * (dk + dv);
      double us[2];
      for (bool mma : {true, false}) {
        cuda::Tuning().attention_mma = mma;
        us[mma] = MedianUs(stream, [&] { gpu.Attention(q, kv, batch, scale, out); }, mma ? 20 : 5);
        cuda::Tuning() = DefaultTuning();
        const double gbps = bytes / (us[mma] * 1e-6) / 1e9, tflops = flops / (us[mma] * 1e-6) / 1e12;
        std::printf("mla decode perf: B%lld ctx%lld H%lld %-4s %9.1f us %6.0f GB/s latent (%.1f%% of copy) "
                    "%6.1f TFLOP/s (%.1f%% of matmul)\n",
                    static_cast<long long>(num_seqs), static_cast<long long>(ctx), static_cast<long long>(hq),
                    mma ? "mma" : "simt", us[mma], gbps, 100.0 * gbps / copy_gbps, tflops,
                    100.0 * tflops / matmul_tflops);
        Record(std::string("Perf.mla_decode_GBps.") + (mma ? "mma" : "simt"),
               "B" + std::to_string(num_seqs) + " ctx" + std::to_string(ctx), gbps, 0);
      }
      std::printf("mla decode perf: B%lld ctx%lld mma / simt %.2fx\n", static_cast<long long>(num_seqs),
                  static_cast<long long>(ctx), us[0] / us[1]);
    }
}

}  // namespace corolla::cuda_test
