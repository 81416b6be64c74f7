// The attention kernels' speed on the GPU (their correctness: attention_kernel_test.cc).
// CudaPerf.Attention prints both kernels' speed ("attention perf:" lines; prefill: simt, mma.sync
// and wgmma, with a "wgmma / mma.sync" ratio line, then wgmma_variant0..5 rows, cpasync and tma
// producer each, with their ratio to variant 0 on cp.async and the tma rows to their cp.async
// twin); CudaPerf.AttentionDecode times the small-batch decode kernel (attention_decode.cu)
// against the mma path. Needs a GPU; skips otherwise.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <functional>
#include <numeric>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/test_util.h"

namespace corolla::cuda_test {

// ---- perf ------------------------------------------------------------------------------------
// Prefill (Qwen3-30B-A3B attention: Hq 32, Hk 4, D 128) at 4k and 8k tokens, TFLOP/s counting
// 4 Hq D flops per (query, visible key) pair, against the bf16 matmul rate measured here; decode
// B 1/64/256 at context 1k and 8k, GB/s of KV read, against the measured HBM copy rate. Both
// kernels; split-KV at its default.
TEST(CudaPerf, Attention) {
  Backend* gpu_ptr = Gpu();
  if (gpu_ptr == nullptr) GTEST_SKIP() << "no CUDA device";
  Backend& gpu = *gpu_ptr;
  DefaultTuning();  // captured before this test changes Tuning()
  cudaStream_t stream = static_cast<cuda::CudaBackend&>(gpu).stream();
  auto time_us = [&](const std::function<void()>& fn, int reps) {
    return MedianUs(stream, fn, reps);
  };
  // Fills a bf16 device tensor with a 1M-value random block repeated (real sizes without
  // minutes of host RNG).
  static const std::vector<float> block = RandomBf16(1 << 20, 1.f);
  Tensor block_dev = Upload(gpu, block, {1 << 20}, DType::kBF16);
  auto fill = [&](const Tensor& t) {
    const size_t total = t.numel() * sizeof(uint16_t), piece = block.size() * sizeof(uint16_t);
    for (size_t off = 0; off < total; off += piece)
      cudaMemcpyAsync(static_cast<char*>(t.view().data) + off, block_dev.view().data,
                      std::min(piece, total - off), cudaMemcpyDeviceToDevice, stream);
  };

  // Limits measured here: HBM copy (1 GiB D2D, read + write) and an 8192^3 bf16 matmul.
  double copy_gbps = 0, matmul_tflops = 0;
  {
    Tensor a = gpu.Empty(DType::kBF16, {int64_t{1} << 29}),
           b = gpu.Empty(DType::kBF16, {int64_t{1} << 29});
    const double us = time_us(
        [&] {
          cudaMemcpyAsync(b.view().data, a.view().data, size_t{1} << 30, cudaMemcpyDeviceToDevice,
                          stream);
        },
        10);
    copy_gbps = 2.0 * (size_t{1} << 30) / (us * 1e-6) / 1e9;
  }
  {
    const int64_t n = 8192;
    Tensor x = gpu.Empty(DType::kBF16, {n, n}), w = gpu.Empty(DType::kBF16, {n, n}),
           y = gpu.Empty(DType::kBF16, {n, n});
    fill(x);
    fill(w);
    const double us = time_us([&] { gpu.Linear(x, w, y); }, 10);
    matmul_tflops = 2.0 * n * n * n / (us * 1e-6) / 1e12;
  }
  std::printf(
      "attention perf: limits: HBM copy %.0f GB/s (read + write), bf16 matmul 8192^3 %.0f "
      "TFLOP/s\n",
      copy_gbps, matmul_tflops);

  const int64_t hq = 32, hk = 4, d = 128, bs = 16;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  // One paged batch: B sequences of q_len new tokens each at context ctx, blocks scrambled.
  struct PerfBatch {
    Tensor q, out, kc, vc, qs, sl, tab, slot;
    AttentionBatch batch;
  };
  auto make_batch = [&](int64_t num_seqs, int64_t q_len, int64_t ctx) {
    PerfBatch pb;
    const int64_t blocks_per_seq = (ctx + bs - 1) / bs, num_blocks = num_seqs * blocks_per_seq;
    const int64_t tokens = num_seqs * q_len;
    pb.q = gpu.Empty(DType::kBF16, {tokens, hq, d});
    pb.out = gpu.Empty(DType::kBF16, {tokens, hq, d});
    pb.kc = gpu.Empty(DType::kBF16, {num_blocks, hk, bs, d});
    pb.vc = gpu.Empty(DType::kBF16, {num_blocks, hk, bs, d});
    fill(pb.q);
    fill(pb.kc);
    fill(pb.vc);
    std::vector<int32_t> perm(num_blocks), qs{0}, sl, slots;
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), Rng());
    for (int64_t b = 0; b < num_seqs; ++b) {
      qs.push_back(static_cast<int32_t>((b + 1) * q_len));
      sl.push_back(static_cast<int32_t>(ctx));
      for (int64_t p = ctx - q_len; p < ctx; ++p)
        slots.push_back(static_cast<int32_t>(perm[b * blocks_per_seq + p / bs] * bs + p % bs));
    }
    pb.qs = UploadI32(gpu, qs, {num_seqs + 1});
    pb.sl = UploadI32(gpu, sl, {num_seqs});
    pb.tab = UploadI32(gpu, perm, {num_seqs, blocks_per_seq});
    pb.slot = UploadI32(gpu, slots, {tokens});
    pb.batch = AttentionBatch{
        pb.qs, pb.sl, pb.tab, pb.slot, static_cast<int>(q_len), static_cast<int>(ctx)};
    return pb;
  };
  auto run = [&](PerfBatch& pb, bool mma, int reps, bool wgmma = true, int wgmma_variant = 0,
                 bool tma = true, bool decode = false) {
    cuda::Tuning().attention_mma = mma;
    cuda::Tuning().attention_decode_kernel = decode;  // "mma" rows: attention_mma.cu
    cuda::Tuning().attention_wgmma = wgmma;
    cuda::Tuning().attention_wgmma_variant = wgmma_variant;
    cuda::Tuning().attention_wgmma_tma = tma;
    const double us = time_us(
        [&] {
          gpu.Attention(pb.q, KvCacheView{pb.kc, pb.vc}, pb.batch, scale, pb.out);
        },
        reps);
    cuda::Tuning() = DefaultTuning();
    return us;
  };

  // Prefill: simt (0; not at 8192, ~30 ms a run), mma.sync (1: attention_wgmma off) and wgmma (2).
  for (int64_t t : {1024, 4096, 8192}) {
    PerfBatch pb = make_batch(1, t, t);
    const double flops = 4.0 * hq * d * (t * (t + 1) / 2);
    double tf[3] = {0, 0, 0};
    static const char* const kNames[3] = {"simt", "mma.sync", "wgmma"};
    for (int kernel = t > 4096 ? 1 : 0; kernel < 3; ++kernel) {
      const double us = run(pb, kernel > 0, kernel > 0 ? 20 : 3, kernel == 2);
      tf[kernel] = flops / (us * 1e-6) / 1e12;
      std::printf(
          "attention perf: prefill T%lld Hq%lld Hk%lld D%lld %-8s %9.1f us %7.1f TFLOP/s (%.1f%% "
          "of matmul)\n",
          static_cast<long long>(t), static_cast<long long>(hq), static_cast<long long>(hk),
          static_cast<long long>(d), kNames[kernel], us, tf[kernel],
          100.0 * tf[kernel] / matmul_tflops);
      Record(std::string("Perf.attn_prefill_TFLOPs.") + (kernel == 0   ? "simt"
                                                         : kernel == 1 ? "mma"
                                                                       : "wgmma"),
             "T" + std::to_string(t), tf[kernel], 0);
    }
    if (tf[0] > 0)
      std::printf("attention perf: prefill T%lld mma.sync / simt %.2fx\n",
                  static_cast<long long>(t), tf[1] / tf[0]);
    std::printf("attention perf: prefill T%lld wgmma / mma.sync %.2fx (%.1f vs %.1f TFLOP/s)\n",
                static_cast<long long>(t), tf[2] / tf[1], tf[2], tf[1]);
    // Every build of the wgmma kernel with the cp.async and the TMA producer (block size 16: TMA
    // boxes of 16 keys), against variant 0 on cp.async (the kernel before TMA): 0 base, 1 grid
    // order (KV heads fastest, heaviest row tiles first), 2 + intra-warpgroup overlap, 3 +
    // ping-pong of the consumer warpgroups, 4 and 5 = 2 and 3 with the fast softmax.
    double base_cpasync = 0;
    for (int wv = 0; wv < cuda::kAttentionWgmmaVariants; ++wv) {
      double tf_cpasync = 0;
      for (bool tma : {false, true}) {
        const double us = run(pb, true, 20, true, wv, tma);
        const double tfv = flops / (us * 1e-6) / 1e12;
        if (!tma) tf_cpasync = tfv;
        if (wv == 0 && !tma) base_cpasync = tfv;
        std::printf(
            "attention perf: prefill T%lld Hq%lld Hk%lld D%lld wgmma_variant%d %-7s %9.1f us %7.1f "
            "TFLOP/s "
            "(%.1f%% of matmul) %.2fx variant0 cpasync, %.2fx this variant's cpasync\n",
            static_cast<long long>(t), static_cast<long long>(hq), static_cast<long long>(hk),
            static_cast<long long>(d), wv, tma ? "tma" : "cpasync", us, tfv,
            100.0 * tfv / matmul_tflops, tfv / base_cpasync, tfv / tf_cpasync);
        Record("Perf.attn_prefill_TFLOPs.wgmma_variant" + std::to_string(wv) +
                   (tma ? ".tma" : ".cpasync"),
               "T" + std::to_string(t), tfv, 0);
      }
    }
  }
  for (int64_t ctx : {1024, 8192})
    for (int64_t num_seqs : {1, 64, 256}) {
      PerfBatch pb = make_batch(num_seqs, 1, ctx);
      const double bytes = 2.0 * num_seqs * ctx * hk * d * sizeof(uint16_t);  // K and V
      double gbps[2];
      for (bool mma : {false, true}) {
        const double us = run(pb, mma, 20);
        gbps[mma] = bytes / (us * 1e-6) / 1e9;
        std::printf(
            "attention perf: decode B%lld ctx%lld Hq%lld Hk%lld D%lld %-4s %9.1f us %7.0f GB/s KV "
            "(%.1f%% of copy)\n",
            static_cast<long long>(num_seqs), static_cast<long long>(ctx),
            static_cast<long long>(hq), static_cast<long long>(hk), static_cast<long long>(d),
            mma ? "mma" : "simt", us, gbps[mma], 100.0 * gbps[mma] / copy_gbps);
        Record(std::string("Perf.attn_decode_GBps.") + (mma ? "mma" : "simt"),
               "B" + std::to_string(num_seqs) + " ctx" + std::to_string(ctx), gbps[mma], 0);
      }
      std::printf("attention perf: decode B%lld ctx%lld mma / simt %.2fx\n",
                  static_cast<long long>(num_seqs), static_cast<long long>(ctx), gbps[1] / gbps[0]);
      {  // The small-batch decode kernel (attention_decode.cu) against the mma one.
        const double us = run(pb, true, 20, true, 0, true, true);
        const double gb = bytes / (us * 1e-6) / 1e9;
        std::printf(
            "attention perf: decode B%lld ctx%lld Hq%lld Hk%lld D%lld decode %9.1f us %7.0f GB/s "
            "KV (%.1f%% of "
            "copy), %.2fx mma\n",
            static_cast<long long>(num_seqs), static_cast<long long>(ctx),
            static_cast<long long>(hq), static_cast<long long>(hk), static_cast<long long>(d), us,
            gb, 100.0 * gb / copy_gbps, gb / gbps[1]);
        Record("Perf.attn_decode_GBps.decode",
               "B" + std::to_string(num_seqs) + " ctx" + std::to_string(ctx), gb, 0);
      }
      // As under graph replay with a context bucket twice the lengths: the split plan sees only
      // the bound, each CTA its sequence's length.
      pb.batch.max_seq_len = static_cast<int>(2 * ctx);
      const double us_loose = run(pb, true, 20);
      std::printf(
          "attention perf: decode B%lld ctx%lld mma, max_seq_len hint %lld: %9.1f us %7.0f GB/s "
          "KV\n",
          static_cast<long long>(num_seqs), static_cast<long long>(ctx),
          static_cast<long long>(2 * ctx), us_loose, bytes / (us_loose * 1e-6) / 1e9);
      const double us_loose_decode = run(pb, true, 20, true, 0, true, true);
      std::printf(
          "attention perf: decode B%lld ctx%lld decode, max_seq_len hint %lld: %9.1f us %7.0f GB/s "
          "KV\n",
          static_cast<long long>(num_seqs), static_cast<long long>(ctx),
          static_cast<long long>(2 * ctx), us_loose_decode, bytes / (us_loose_decode * 1e-6) / 1e9);
    }
}

// The small-batch decode kernel (attention_decode.cu) against attention_mma.cu's decode path on
// Qwen3-30B-A3B's attention (Hq 32, Hk 4, D 128, block size 16): microseconds per op, mean of 50
// back-to-back calls on the stream (PDL overlaps each launch with the previous op's tail) and of
// 20 calls replayed in one CUDA graph, GB/s of KV, and the mma / decode ratio. Then the decode
// kernel's split knobs at batch 1 (Tuning().attention_decode_split_keys, attention_split_min_ctas).
// "attention decode perf:" lines.
TEST(CudaPerf, AttentionDecode) {
  Backend* gpu_ptr = Gpu();
  if (gpu_ptr == nullptr) GTEST_SKIP() << "no CUDA device";
  Backend& gpu = *gpu_ptr;
  const cuda::KernelTuning defaults = DefaultTuning();
  cudaStream_t stream = static_cast<cuda::CudaBackend&>(gpu).stream();
  const int64_t hq = 32, hk = 4, d = 128, bs = 16;
  std::printf(
      "attention decode perf: B | ctx | kernel | stream us | graph us | GB/s KV (graph) | mma / "
      "this (graph)\n");
  for (int64_t ctx : {1024, 8192})
    for (int64_t b : {1, 2, 8, 64}) {
      const int64_t blocks_per_seq = (ctx + bs - 1) / bs, num_blocks = b * blocks_per_seq;
      Tensor q = Upload(gpu, RandomBf16(b * hq * d), {b, hq, d}, DType::kBF16);
      Tensor kc = gpu.Empty(DType::kBF16, {num_blocks, hk, bs, d}),
             vc = gpu.Empty(DType::kBF16, {num_blocks, hk, bs, d});
      cudaMemsetAsync(kc.view().data, 0, kc.view().nbytes(),
                      stream);  // the time does not depend on values
      cudaMemsetAsync(vc.view().data, 0, vc.view().nbytes(), stream);
      std::vector<int32_t> qs(b + 1), sl(b, static_cast<int32_t>(ctx)), tab(b * blocks_per_seq);
      std::iota(qs.begin(), qs.end(), 0);
      std::iota(tab.begin(), tab.end(), 0);
      std::shuffle(tab.begin(), tab.end(), Rng());
      Tensor gqs = UploadI32(gpu, qs, {b + 1}), gsl = UploadI32(gpu, sl, {b});
      Tensor gtab = UploadI32(gpu, tab, {b, blocks_per_seq}),
             gslot = UploadI32(gpu, std::vector<int32_t>(b, 0), {b});
      Tensor out = gpu.Empty(DType::kBF16, {b, hq, d});
      const AttentionBatch batch{gqs, gsl, gtab, gslot, 1, static_cast<int>(ctx)};
      const double bytes = 2.0 * b * ctx * hk * d * 2;  // K and V
      auto op = [&] { gpu.Attention(q, KvCacheView{kc, vc}, batch, 0.088f, out); };
      auto measure = [&](bool decode, double* graph_us) {
        cuda::Tuning() = defaults;
        cuda::Tuning().attention_decode_kernel = decode;
        const double stream_us = TimeUs(stream, op, 50);
        auto graph = gpu.CaptureGraph([&] {
          for (int i = 0; i < 20; ++i) op();
        });
        *graph_us = graph.ok() ? TimeUs(
                                     stream, [&] { graph.value()->Replay(); }, 10) /
                                     20
                               : 0.0;
        cuda::Tuning() = defaults;
        return stream_us;
      };
      double graph_us[2];
      const double stream_us[2] = {measure(false, &graph_us[0]), measure(true, &graph_us[1])};
      for (int k = 0; k < 2; ++k) {
        std::printf("attention decode perf: %lld | %lld | %-6s | %7.2f | %7.2f | %6.0f | %.2fx\n",
                    static_cast<long long>(b), static_cast<long long>(ctx), k ? "decode" : "mma",
                    stream_us[k], graph_us[k],
                    graph_us[k] > 0 ? bytes / (graph_us[k] * 1e-6) / 1e9 : 0.0,
                    graph_us[k] > 0 ? graph_us[0] / graph_us[k] : 0.0);
        const std::string shape = "B" + std::to_string(b) + " ctx" + std::to_string(ctx);
        Record(std::string("Perf.attn_decode_us.") + (k ? "decode" : "mma"), shape, graph_us[k], 0);
      }
      if (b == 1) {  // the decode kernel's split knobs
        for (int keys : {16, 32, 64, 128, 256})
          for (int min_ctas : {132, 264, 528}) {
            cuda::Tuning().attention_decode_split_keys = keys;
            cuda::Tuning().attention_split_min_ctas = min_ctas;
            const double us = TimeUs(stream, op, 50);
            std::printf(
                "attention decode perf: B1 ctx%lld decode split_keys %d min_ctas %d: %7.2f us "
                "(stream)\n",
                static_cast<long long>(ctx), keys, min_ctas, us);
            cuda::Tuning() = defaults;
          }
      }
    }
}

}  // namespace corolla::cuda_test
