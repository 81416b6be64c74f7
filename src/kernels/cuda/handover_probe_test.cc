// Probes of the batch-1 decode step's memory system and code (benchmarks: they print figures
// and check only that every probe ran). CudaPerf.HandoverUnderCopies: the step's handovers (a
// programmatic dependent launch's release, a flag between CTAs three ways, an L2 round trip)
// alone and with bulk copies in flight on other SMs (handover_probe.h; no peer missing, the
// copier moving data). CudaPerf.L2RetentionUnderStream: l2_probe.h. CudaPerf.ColdCode and
// CudaPerf.DecodeOpsColdCode: code_probe.h, and a layer's ops with their code cold.
// CudaPerf.RouteTokenPicks: route_probe.h (also: both pick methods choose the same experts).
// CudaPerf.MoeDecodeL2Warm: the batch-1 MoE with its experts cold, in L2, or prefetched into L2
// during a gap before it (l2_probe.h).
#include "kernels/cuda/handover_probe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cuda/code_probe.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/l2_probe.h"
#include "kernels/cuda/route_probe.h"
#include "kernels/cuda/test_util.h"

namespace corolla::cuda_test {
namespace {

// The device's SM count, or 0 with the reason in `skip` where the probes do not apply (they are
// sized for an H100/H200).
int ProbeSms(std::string& skip) {
  if (Gpu() == nullptr) {
    skip = "no CUDA device";
    return 0;
  }
  int device = 0, sms = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (sms >= 72) return sms;
  skip = "sized for an H100/H200 (" + std::to_string(sms) + " SMs)";
  return 0;
}

TEST(CudaPerf, HandoverUnderCopies) {
  std::string skip;
  const int sms = ProbeSms(skip);
  if (sms == 0) GTEST_SKIP() << skip;
  const int64_t bytes = int64_t{1} << 30;  // far past L2: the copies come from HBM
  void* src = nullptr;
  COROLLA_CUDA_CHECK(cudaMalloc(&src, bytes));
  COROLLA_CUDA_CHECK(cudaMemset(src, 1, bytes));
  cudaStream_t s = nullptr, side = nullptr;
  COROLLA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  COROLLA_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  struct Case {
    int ctas, chunk;  // copier CTAs (0: none) and bytes a copy (4 in flight a CTA)
    int64_t from;     // bytes of src the copier walks: 1 GB from HBM, 24 MB from L2
  };
  // o_proj's staged copies come from 64-128 CTAs at once; the small chunks pull less; session 12
  // saw the chain held back by copies of rows already in L2 as by copies from HBM.
  const int64_t l2 = int64_t{24} << 20;
  const Case cases[] = {{0, 32768, bytes},       {64, 32768, bytes},      {sms - 4, 8192, bytes},
                        {sms - 4, 32768, bytes}, {sms - 4, 32768, l2},     {0, 32768, bytes}};
  for (const Case& c : cases) {
    const cuda::HandoverProbe r = cuda::RunHandoverProbe(src, c.from, c.ctas, c.chunk, 50, s, side);
    std::printf(
        "handover: copier %3d CTAs x 4 x %2d KB from %4lld MB: pdl release %5.2f us, flag %5.2f us "
        "(no store before %5.2f, relaxed %5.2f), L2 trip %5.2f us, copies %5.0f GB/s%s\n",
        c.ctas, c.chunk / 1024, static_cast<long long>(c.from >> 20), r.pdl_release_us, r.flag_us,
        r.flag_clean_us, r.flag_relaxed_us, r.l2_trip_us, r.copy_gbs, r.timed_out ? " (timed out)" : "");
    EXPECT_FALSE(r.timed_out) << c.ctas << " copier CTAs";
    EXPECT_GT(r.pdl_release_us, 0.0);
    EXPECT_GT(r.flag_us, 0.0);
    EXPECT_GT(r.flag_clean_us, 0.0);
    EXPECT_GT(r.flag_relaxed_us, 0.0);
    EXPECT_GT(r.l2_trip_us, 0.0);
    if (c.ctas > 0) {
      EXPECT_GT(r.copy_gbs, 100.0) << "the copier moved next to nothing";
    }
  }
  COROLLA_CUDA_CHECK(cudaStreamDestroy(s));
  COROLLA_CUDA_CHECK(cudaStreamDestroy(side));
  COROLLA_CUDA_CHECK(cudaFree(src));
}

// CudaPerf.L2RetentionUnderStream: Qwen3-30B-A3B's qkv weights (5120 x 2048 bf16, 21 MB) read
// as the staged GEMV reads them, cold, hot, and after an L2 prefetch with the MoE's 75 MB weight
// stream in between (l2_probe.h). A benchmark: it prints the figures and checks only that every
// case ran.
TEST(CudaPerf, L2RetentionUnderStream) {
  std::string skip;
  const int sms = ProbeSms(skip);
  if (sms == 0) GTEST_SKIP() << skip;
  const int64_t bytes = int64_t{2} << 30;
  void* buf = nullptr;
  COROLLA_CUDA_CHECK(cudaMalloc(&buf, bytes));
  COROLLA_CUDA_CHECK(cudaMemset(buf, 1, bytes));
  cudaStream_t s = nullptr;
  COROLLA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (const int64_t stream_mb : {75, 150}) {
    const cuda::L2RetentionProbe r =
        cuda::RunL2RetentionProbe(buf, bytes, int64_t{5120} * 2048 * 2, stream_mb << 20, 3, s);
    std::printf(
        "l2 retention: %.1f MB a read, %lld MB stream: cold %.2f us, hot %.2f, prefetched %.2f, evict-last + "
        "evict-first stream %.2f, evict-normal + stream %.2f, evict-last + normal stream %.2f\n",
        r.region_mb, static_cast<long long>(stream_mb), r.cold_us, r.hot_us, r.prefetched_us, r.last_stream_us,
        r.normal_stream_us, r.last_normal_stream_us);
    for (double us : {r.cold_us, r.hot_us, r.prefetched_us, r.last_stream_us, r.normal_stream_us,
                      r.last_normal_stream_us})
      EXPECT_GT(us, 0.0);
  }
  COROLLA_CUDA_CHECK(cudaStreamDestroy(s));
  COROLLA_CUDA_CHECK(cudaFree(buf));
}

// CudaPerf.ColdCode: straight-line kernels of 4, 16 and 64 KB of code (one CTA an SM) run warm,
// with their code in L2 only (after 256 KB of other code on every SM), and from HBM (that and a
// 256 MB memset), code_probe.h. A benchmark: it prints the figures and checks only that every
// case ran.
TEST(CudaPerf, ColdCode) {
  std::string skip;
  if (ProbeSms(skip) == 0) GTEST_SKIP() << skip;
  cudaStream_t s = nullptr;
  COROLLA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (const int kb : {4, 16, 64}) {
    const cuda::ColdCodeProbe r = cuda::RunColdCodeProbe(kb, 9, s);
    std::printf(
        "cold code: %2d KB: warm %6.2f us (%6.0f cycles), code from L2 %6.2f us (%6.0f), from HBM "
        "%6.2f us (%6.0f)\n",
        kb, r.warm_us, r.warm_cycles, r.icache_cold_us, r.icache_cold_cycles, r.l2_cold_us,
        r.l2_cold_cycles);
    for (double us : {r.warm_us, r.icache_cold_us, r.l2_cold_us}) EXPECT_GT(us, 0.0);
  }
  COROLLA_CUDA_CHECK(cudaStreamDestroy(s));
}

// Qwen3-30B-A3B's batch-1 decode ops (one layer's, through the ops the engine calls), each timed
// alone (events around one call, median of 25): right after the same call, its code in the SMs'
// instruction caches, and after 256 KB of other code on every SM (ThrashInstructionCaches: its
// code from L2; its data in L2 both times). The difference is what the op's code costs cold,
// which the decode graph may pay every layer: an SM runs ~10 kernels a layer, far more code than
// its instruction caches hold (CudaPerf.ColdCode; notes/decode_timeline.md, session 37's list).
// Weights are zeros: the times do not depend on the values.
TEST(CudaPerf, DecodeOpsColdCode) {
  Backend* gpu = Gpu();
  if (gpu == nullptr) GTEST_SKIP() << "no CUDA device";
  cudaStream_t stream = dynamic_cast<cuda::CudaBackend&>(*gpu).stream();
  const int64_t h = 2048, hq = 32, hk = 4, d = 128, experts = 128, inter = 768, ctx = 1024, bs = 16;
  const int k = 8;
  auto zeros = [&](Shape shape, DType dt = DType::kBF16) {
    Tensor t = gpu->Empty(dt, shape);
    COROLLA_CUDA_CHECK(cudaMemsetAsync(t.view().data, 0, t.view().nbytes(), stream));
    return t;
  };
  Tensor y = Upload(*gpu, RandomBf16(h), {1, h}, DType::kBF16);
  Tensor sum = Upload(*gpu, RandomBf16(h), {1, h}, DType::kBF16);
  Tensor x = gpu->Empty(DType::kBF16, {1, h});
  Tensor norm_w = Upload(*gpu, std::vector<float>(h, 1.f), {h}, DType::kBF16);
  Tensor w_qkv = zeros({(hq + 2 * hk) * d, h}),
         qkv = gpu->Empty(DType::kBF16, {1, (hq + 2 * hk) * d});
  Tensor w_o = zeros({h, hq * d}), o = gpu->Empty(DType::kBF16, {1, h});
  Tensor w_router = Upload(*gpu, RandomBf16(experts * h, 0.02f), {experts, h}, DType::kBF16);
  Tensor ids = gpu->Empty(DType::kI32, {1, k}), wts = gpu->Empty(DType::kF32, {1, k});
  MoeRouting routing;
  routing.top_k = k;
  Tensor w_gu = zeros({experts, 2 * inter, h}), w_down = zeros({experts, h, inter});
  std::vector<int32_t> chosen(k);
  for (int i = 0; i < k; ++i) chosen[i] = 16 * i;
  Tensor fixed_ids = UploadI32(*gpu, chosen, {1, k});
  Tensor fixed_wts = Upload(*gpu, std::vector<float>(k, 1.f / k), {1, k}, DType::kF32);
  Tensor moe_out = gpu->Empty(DType::kBF16, {1, h});
  const int64_t blocks = ctx / bs;
  Tensor q = Upload(*gpu, RandomBf16(hq * d), {1, hq, d}, DType::kBF16);
  Tensor kc = zeros({blocks, hk, bs, d}), vc = zeros({blocks, hk, bs, d});
  std::vector<int32_t> tab(blocks);
  std::iota(tab.begin(), tab.end(), 0);
  Tensor gqs = UploadI32(*gpu, {0, 1}, {2}),
         gsl = UploadI32(*gpu, {static_cast<int32_t>(ctx)}, {1});
  Tensor gtab = UploadI32(*gpu, tab, {1, blocks}), gslot = UploadI32(*gpu, {0}, {1});
  Tensor attn = gpu->Empty(DType::kBF16, {1, hq, d});
  AttentionBatch batch{gqs, gsl, gtab, gslot, 1, static_cast<int>(ctx)};
  struct Op {
    const char* name;
    std::function<void()> run;
  };
  const Op ops[] = {
      {"norm + qkv", [&] { gpu->RmsNormLinear(y, norm_w, 1e-6f, sum, x, w_qkv, qkv); }},
      {"attention",
       [&] {
         gpu->Attention(q, KvCacheView{kc, vc}, batch, 0.088f, attn);
       }},
      {"o_proj",
       [&] {
         gpu->Linear(attn.view().Reshape({1, hq * d}), w_o, o);
       }},
      {"norm + router",
       [&] { gpu->RmsNormMoeRouter(y, norm_w, 1e-6f, sum, x, w_router, routing, ids, wts); }},
      {"experts", [&] { gpu->MoeExperts(x, fixed_ids, fixed_wts, w_gu, w_down, moe_out); }},
  };
  for (int i = 0; i < 20; ++i) cuda::ThrashInstructionCaches(stream);  // the clocks up from idle
  for (const Op& op : ops) {
    std::vector<double> warm, cold;
    for (int r = 0; r < 25; ++r) {
      op.run();
      warm.push_back(1e3 * EventMs(stream, op.run));
      cuda::ThrashInstructionCaches(stream);
      cold.push_back(1e3 * EventMs(stream, op.run));
    }
    std::sort(warm.begin(), warm.end());
    std::sort(cold.begin(), cold.end());
    const double w = warm[warm.size() / 2], c = cold[cold.size() / 2];
    std::printf("decode ops cold code: %-13s warm %6.2f us, code cold %6.2f us (%+.2f)\n", op.name,
                w, c, c - w);
    EXPECT_GT(w, 0.0) << op.name;
  }
}

// One warp routing one token (E 128, top 8; Qwen3-30B-A3B's router) over 512 sets of fresh
// logits, a quarter of them with tied scores: the scores alone and the whole routing, dividing
// the scores by their sum with DDIV or through DivideByReciprocal, median cycles. Both divisions
// must give the same ids and weights (bits), each set's ids distinct and in range, its weights
// summing to 1; and DivideByReciprocal the division's bits over 2^28 random pairs.
TEST(CudaPerf, RouteTokenPicks) {
  std::string skip;
  if (ProbeSms(skip) == 0) GTEST_SKIP() << skip;
  constexpr int kSets = 512, kExperts = 128, kTopK = 8;
  std::vector<float> logits = RandomBf16(int64_t{kSets} * kExperts, 2.0f);
  for (int s = 0; s < kSets; s += 4) {  // ties: pairs of equal logits, and one flat row
    float* row = logits.data() + static_cast<size_t>(s) * kExperts;
    for (int e = 1; e < kExperts; e += 3) row[e] = row[e - 1];
    if (s % 64 == 0) std::fill(row, row + kExperts, 0.5f);
  }
  int device = 0, khz = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
  const char* names[] = {"scores, DDIV", "scores, reciprocal", "routing, DDIV",
                         "routing, reciprocal", "routing by logits"};
  cuda::RouteProbe by_mode[5];
  for (int mode = 0; mode < 5; ++mode) {
    by_mode[mode] = cuda::RunRouteProbe(logits, kSets, kExperts, kTopK, mode);
    std::vector<int64_t> c(by_mode[mode].cycles.begin() + 8, by_mode[mode].cycles.end());  // warm
    std::sort(c.begin(), c.end());
    const int64_t median = c[c.size() / 2];
    std::printf(
        "route token (E %d, top %d): %-20s median %5lld cycles (%.2f us at %d MHz), p90 %5lld\n",
        kExperts, kTopK, names[mode], static_cast<long long>(median), median / (khz * 1e-3),
        khz / 1000, static_cast<long long>(c[c.size() * 9 / 10]));
    EXPECT_GT(median, 0);
  }
  const cuda::RouteProbe &a = by_mode[2], &b = by_mode[3];
  EXPECT_EQ(a.ids, b.ids);
  for (size_t i = 0; i < a.weights.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(a.weights[i]), std::bit_cast<uint32_t>(b.weights[i]))
        << "pick " << i;
  for (int s = 0; s < kSets; ++s) {
    std::vector<int32_t> ids(a.ids.begin() + s * kTopK, a.ids.begin() + (s + 1) * kTopK);
    double sum = 0;
    for (int k = 0; k < kTopK; ++k) sum += a.weights[s * kTopK + k];
    std::sort(ids.begin(), ids.end());
    EXPECT_TRUE(ids.front() >= 0 && ids.back() < kExperts &&
                std::adjacent_find(ids.begin(), ids.end()) == ids.end())
        << "set " << s;
    EXPECT_NEAR(sum, 1.0, 1e-5) << "set " << s;
  }
  // The flat row's picks: the eight lowest ids in order (ties to the lower id).
  for (int k = 0; k < kTopK; ++k) EXPECT_EQ(a.ids[k], k);
  // By the logits (mode 4): the same picks, but where two logits' scores round to one f32 (then
  // the logits within 1e-6), and weights within 1e-6.
  const cuda::RouteProbe& c = by_mode[4];
  for (size_t i = 0; i < a.ids.size(); ++i) {
    const size_t s = i / kTopK;
    const float la = logits[s * kExperts + a.ids[i]], lc = c.ids[i] >= 0 && c.ids[i] < kExperts
                                                            ? logits[s * kExperts + c.ids[i]]
                                                            : NAN;
    EXPECT_TRUE(c.ids[i] == a.ids[i] || std::abs(la - lc) <= 1e-6f * std::max(1.0f, std::abs(la)))
        << "set " << s << " pick " << i % kTopK << ": " << c.ids[i] << " vs " << a.ids[i];
    EXPECT_NEAR(c.weights[i], a.weights[i], 1e-6) << "set " << s << " pick " << i % kTopK;
  }
  const int64_t pairs = int64_t{1} << 28,
                bad = cuda::DivideByReciprocalMismatches(pairs, TestSeed("division"));
  std::printf("route token: DivideByReciprocal differs from the division in %lld of %lld pairs\n",
              static_cast<long long>(bad), static_cast<long long>(pairs));
  EXPECT_EQ(bad, 0);
}

}  // namespace
// CudaPerf.MoeDecodeL2Warm: how much faster the batch-1 MoE (Qwen3-30B-A3B's experts, the pair
// kernels behind Backend::MoeExperts) runs with its weights in L2, and whether a prefetch issued
// during a latency-bound gap before it (LaunchL2Gap: the attention and routing, when HBM is
// idle) puts them there: the upper bound of prefetching predicted experts. One graph of 48 calls
// a case; calls cycle over 16 disjoint expert sets (1.2 GB between reuses: cold) unless the case
// repeats one set. A benchmark: it prints the figures and checks only that every case ran.
TEST(CudaPerf, MoeDecodeL2Warm) {
  std::string skip;
  const int sms = ProbeSms(skip);
  if (sms == 0) GTEST_SKIP() << skip;
  Backend* gpu = Gpu();
  constexpr int kExperts = 128, kTopK = 8, kSets = kExperts / kTopK, kCalls = 48;
  constexpr int64_t kHidden = 2048, kInter = 768;
  constexpr uint64_t kGapNs = 10'000;
  cudaStream_t stream = dynamic_cast<cuda::CudaBackend&>(*gpu).stream();
  Tensor wgu = gpu->Empty(DType::kBF16, {kExperts, 2 * kInter, kHidden});
  Tensor wd = gpu->Empty(DType::kBF16, {kExperts, kHidden, kInter});
  COROLLA_CUDA_CHECK(cudaMemsetAsync(wgu.view().data, 0x3c, wgu.view().nbytes(), stream));  // bf16 ~0.0115
  COROLLA_CUDA_CHECK(cudaMemsetAsync(wd.view().data, 0x3c, wd.view().nbytes(), stream));
  std::vector<int32_t> order(kExperts);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), Rng());
  std::vector<Tensor> ids;
  for (int set = 0; set < kSets; ++set)
    ids.push_back(UploadI32(*gpu, std::vector<int32_t>(order.begin() + set * kTopK, order.begin() + (set + 1) * kTopK),
                            {1, kTopK}));
  Tensor wts = Upload(*gpu, std::vector<float>(kTopK, 1.0f / kTopK), {1, kTopK}, DType::kF32);
  Tensor x = Upload(*gpu, RandomBf16(kHidden), {1, kHidden}, DType::kBF16);
  Tensor out = gpu->Empty(DType::kBF16, {1, kHidden});
  const int64_t gu_bytes = 2 * kInter * kHidden * 2, d_bytes = kHidden * kInter * 2;
  // The ranges of set `set`'s weights a case prefetches: the first `gu_part` of each expert's
  // gate/up rows (gate then up, [2 I, H]), and its down rows where `down`.
  auto ranges = [&](int set, double gu_part, bool down) {
    cuda::L2Ranges r;
    for (int j = 0; j < kTopK; ++j) {
      const int e = order[set * kTopK + j];
      if (gu_part > 0) {
        r.p[r.n] = static_cast<const char*>(wgu.view().data) + e * gu_bytes;
        r.bytes[r.n++] = static_cast<int64_t>(gu_bytes * gu_part) / 4096 * 4096;
      }
      if (down) {
        r.p[r.n] = static_cast<const char*>(wd.view().data) + e * d_bytes;
        r.bytes[r.n++] = d_bytes;
      }
    }
    return r;
  };
  struct Case {
    const char* name;
    bool repeat;     // one set every call
    bool gap;        // a kGapNs gap before each call
    double gu_part;  // of each expert's gate/up rows prefetched during the gap
    bool down;       // its down rows too
    bool moe = true;  // false: the gap alone
  };
  const Case cases[] = {{"cold", false, false, 0, false},
                        {"one set every call (in L2 as far as 75 MB fits)", true, false, 0, false},
                        {"gap, cold", false, true, 0, false},
                        {"gap, a quarter of gate/up prefetched (12.6 MB)", false, true, 0.25, false},
                        {"gap, half of gate/up prefetched (25 MB)", false, true, 0.5, false},
                        {"gap, gate/up prefetched (50 MB)", false, true, 1.0, false},
                        {"gap, gate/up and down prefetched (75 MB)", false, true, 1.0, true},
                        {"gap alone", false, true, 0, false, false},
                        {"gap alone, half of gate/up prefetched", false, true, 0.5, false, false}};
  const double layer_bytes = kTopK * 3.0 * kInter * kHidden * 2;
  for (const Case& c : cases) {
    int call = 0;
    const double us = GraphUs(stream, [&] {
      const int set = c.repeat ? 0 : call++ % kSets;
      if (c.gap) cuda::LaunchL2Gap(ranges(set, c.gu_part, c.down), kGapNs, sms, stream);
      if (c.moe) gpu->MoeExperts(x, ids[set], wts, wgu, wd, out);
    }, kCalls);
    const double moe_us = us - (c.gap ? kGapNs * 1e-3 : 0.0);
    std::printf("moe l2: %-50s %7.2f us a call, %6.2f past the gap (%.2f TB/s)\n", c.name, us, moe_us,
                c.moe ? layer_bytes / (moe_us * 1e-6) / 1e12 : 0.0);
    Record("Perf.moe_l2_warm_us", c.name, us, 0);
    EXPECT_GT(us, 0.0) << c.name;
  }
}

}  // namespace corolla::cuda_test
