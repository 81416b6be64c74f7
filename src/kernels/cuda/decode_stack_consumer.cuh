// The persistent decode kernel's consumer warps (decode_stack.cu): the norms, the GEMV rows of
// the ring stages they own, and the attention task. Device code; included by decode_stack.cu only.
#pragma once

#include "kernels/cuda/decode_stack.cuh"

namespace corolla::cuda {
namespace {

struct Consumer {
  const StackParams& p;
  uint8_t* smem;
  int tid, warp, lane;

  __device__ bf16_t* vec() const { return reinterpret_cast<bf16_t*>(smem + SmemLayout::kVec); }
  __device__ float* act() const { return reinterpret_cast<float*>(smem + SmemLayout::kAct); }
  __device__ float* misc() const { return reinterpret_cast<float*>(smem + SmemLayout::kMisc); }
  // COROLLA_DECODE_STACK_TRACE: when this CTA's consumers finished phase `event` of `layer`.
  __device__ void Trace(int layer, int event) const {
    if (tid == 0) TraceNow(p.trace, layer, event);
  }

  // Arrives at grid barrier `target` once every consumer of this CTA is done, and returns once
  // every CTA has arrived. Writes before it (any consumer thread) are visible after it.
  __device__ void GridSync(unsigned target) const {
    ConsumerSync();
    if (tid == 0) {
      ArriveRelease(p.sync + kSyncGrid);
      StackSpin(p.sync + kSyncGrid, target);
    }
    ConsumerSync();
  }

  // vec = bf16(rmsnorm(src) * w), src [n] bf16 (another CTA may have written it: read from L2).
  __device__ void NormInto(const bf16_t* src, const void* w, int n, bf16_t* dst) {
    float ss = 0.f;
    for (int c = tid; c < n / 8; c += kConsumers) {
      float a[8];
      Unpack8(LoadCg8(src + c * 8), a);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += a[i] * a[i];
    }
    ss = WarpSum(ss);
    if (lane == 0) misc()[warp] = ss;
    ConsumerSync();
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < kConsumerWarps; ++i) total += misc()[i];
    const float inv = rsqrtf(total / n + p.eps);
    for (int c = tid; c < n / 8; c += kConsumers) {
      float a[8];
      Unpack8(LoadCg8(src + c * 8), a);
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = NormWeight(w, p.norm_f32, c * 8 + i) * (a[i] * inv);
      Store8(dst + 8 * c, Pack8(a));
    }
    ConsumerSync();  // dst complete; misc free again
  }

  // The stages of the GEMV phases belong to consumer warps by ring slot (StageSharers: one
  // warp a slot, or two for a ring of 4 stages), each computing whole rows of its part of the
  // stage and freeing it alone: several stages in work at once and no barrier between them. A
  // slot's owners are fixed, so they meet the slot's phases in order (a parity wait must never
  // run a phase ahead). Returns this warp's part of the current stage, or -1 if it has none.
  __device__ int Part(const Ring& ring) const {
    return (warp & ring.owner_mask) == (static_cast<int>(ring.slot) & ring.owner_mask)
               ? warp >> ring.owner_shift
               : -1;
  }
  // Items [0, n) of a stage split over its sharers: part `part`'s [begin, end).
  __device__ static Range PartOf(int n, int part, int sharers) {
    if (sharers == 1) return {0, n};
    return {n * part / sharers, n * (part + 1) / sharers};
  }
  __device__ const bf16_t* StageRows(const Ring& ring) const {
    return reinterpret_cast<const bf16_t*>(smem + (ring.Stage() - SmemAddr(smem)));
  }

  // kRows rows of w (each k long, `stride` elements apart (0: k), shared memory) dotted with x
  // (shared, bf16 or f32 [k]): sums in out[0, kRows) on every lane. kRows is a template argument so
  // the loop has no per-row guards (a guard on a value the compiler cannot see is warp-uniform
  // costs a convergence barrier per row and chunk).
  template <int kRows, typename X>
  __device__ void DotRowsN(const bf16_t* w, int k, const X* x, float (&out)[4],
                           int stride = 0) const {
    if (stride == 0) stride = k;
    float acc[kRows] = {};
    const int chunks = k / 8;
#pragma unroll 2
    for (int c = lane; c < chunks; c += 32) {
      float xf[8];
      Load8(x + c * 8, xf);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float wf[8];
        Load8(w + r * stride + c * 8, wf);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r] = fmaf(wf[i], xf[i], acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) out[r] = WarpSum(acc[r]);  // independent shuffle chains
  }
  // Rows [0, n) of the stage dotted with x, four at a time; emit(row, value) on lane 0.
  template <typename X, typename Emit>
  __device__ void DotRows(const bf16_t* w, int n, int k, const X* x, Emit emit) const {
    for (int r0 = 0; r0 < n; r0 += 4) {
      float v[4];
      const int rows = min(4, n - r0);
      const bf16_t* wr = w + r0 * k;
      if (rows == 4)
        DotRowsN<4>(wr, k, x, v);
      else if (rows == 3)
        DotRowsN<3>(wr, k, x, v);
      else if (rows == 2)
        DotRowsN<2>(wr, k, x, v);
      else
        DotRowsN<1>(wr, k, x, v);
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < 4; ++r)
          if (r < rows) emit(r0 + r, v[r]);
      }
    }
  }

  // Rows [r0, r1) of a [*, k] weight from the ring, dotted with x (bf16 or f32 [k], shared
  // memory); out(row, value) on lane 0 of the warp that owns the row's part of its stage.
  template <typename X, typename Out>
  __device__ void Gemv(Ring& ring, int r0, int r1, int k, const X* x, Out out) {
    const int per = RowsPerStage(k);
    for (int r = r0; r < r1; r += per, ring.Next()) {
      const int part = Part(ring);
      if (part < 0) continue;
      const Range mine = PartOf(min(per, r1 - r), part, ring.Sharers());
      ring.WaitFull();
      if (mine.end > mine.begin)
        DotRows(StageRows(ring) + mine.begin * k, mine.end - mine.begin, k, x,
                [&](int row, float v) { out(r + mine.begin + row, v); });
      ring.Release(lane);
    }
  }

  // ---- attention task (KV head g, split s) ------------------------------------------------------
  __device__ void Attention(Ring& ring, const StackLayer& L, int layer, const SplitPlan& plan) {
    const int c = blockIdx.x, g = c / plan.splits, s = c % plan.splits;
    const int group = p.hq / p.hk;
    bf16_t* qs = reinterpret_cast<bf16_t*>(smem + SmemLayout::kQ);
    bf16_t* new_kv = reinterpret_cast<bf16_t*>(smem + SmemLayout::kNewKv);
    const bool last = s == plan.splits - 1;
    if (p.head_wait) {  // the CTAs that write this head's q, k and v rows are done with them
      if (tid == 0)
        StackSpin(p.sync + kSyncQkvHead + g * 32,
                  static_cast<unsigned>((layer + 1) * p.qkv_head_arrivals[g]));
      ConsumerSync();
    }
    // RoPE of the lane's 4 elements e0.. (pairs (i, i + 64): the partner sits in lane ^ 16).
    const int e0 = lane * 4;
    float cs[4], sn[4];
    {
      const float pos = static_cast<float>(p.positions[0]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sincosf(pos * p.inv_freq[(e0 + i) % (kD / 2)], &sn[i], &cs[i]);
        cs[i] *= p.attention_factor;
        sn[i] *= lane < 16 ? -p.attention_factor : p.attention_factor;
      }
    }
    auto norm_rope = [&](const bf16_t* src, const void* w, bf16_t* dst) {
      float a[4];
      const uint2 u = __ldcg(reinterpret_cast<const uint2*>(src + e0));
      const bf16_t* h = reinterpret_cast<const bf16_t*>(&u);
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = __bfloat162float(h[i]);
        ss += a[i] * a[i];
      }
      ss = WarpSum(ss);
      const float inv = rsqrtf(ss / kD + p.eps);
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = NormWeight(w, p.norm_f32, e0 + i) * (a[i] * inv);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float partner = __shfl_xor_sync(0xffffffffu, a[i], 16);
        dst[e0 + i] = __float2bfloat16(a[i] * cs[i] + partner * sn[i]);
      }
    };
    for (int hh = warp; hh < group; hh += kConsumerWarps)
      norm_rope(p.qkv_out + (g * group + hh) * kD, L.q_norm, qs + hh * kD);
    if (last && warp == 0) {  // the new token's K (normed, rotated) and V, also into the cache
      const int kv_base = p.hq * kD;
      norm_rope(p.qkv_out + kv_base + g * kD, L.k_norm, new_kv);
      const uint2 v =
          __ldcg(reinterpret_cast<const uint2*>(p.qkv_out + kv_base + (p.hk + g) * kD + e0));
      *reinterpret_cast<uint2*>(new_kv + kD + e0) = v;
      __syncwarp();
      const int slot = p.slot_mapping[0];
      if (slot >= 0 && slot < p.num_slots) {
        const int64_t row = (static_cast<int64_t>(slot / p.block_size) * p.hk + g) * p.block_size +
                            slot % p.block_size;
        *reinterpret_cast<uint2*>(L.k_cache + row * kD + e0) =
            *reinterpret_cast<const uint2*>(new_kv + e0);
        *reinterpret_cast<uint2*>(L.v_cache + row * kD + e0) = v;
      }
    }
    ConsumerSync();
    Trace(layer, 18);
    // Online softmax state of the warp's heads (warp, warp + 8): lane's dims e0..e0+3.
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, o[2][4] = {};
    // One chunk: n keys, K rows at kr, V rows at vr (shared memory, [n][kD] bf16).
    // One chunk of n <= 32 keys (K rows at kr, V rows at vr, [n][kD] bf16 in shared memory),
    // each warp for its own heads: lane j scores key j (K read in a rotated 16-byte order, so a
    // quarter warp touches every bank once), softmax across the lanes, then P V with p_j
    // broadcast from lane j and the lane's 4 output dims.
    auto chunk = [&](const bf16_t* kr, const bf16_t* vr, int n) {
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int hh = warp + t * kConsumerWarps;
        if (hh >= group) break;
        float sc = -INFINITY;
        if (lane < n) {
          float acc = 0.f;
#pragma unroll 4
          for (int i = 0; i < kD / 8; ++i) {
            const int cidx = (i + lane) % (kD / 8);
            float kf[8], qf[8];
            Load8(kr + lane * kD + cidx * 8, kf);
            Load8(qs + hh * kD + cidx * 8, qf);
#pragma unroll
            for (int u = 0; u < 8; ++u) acc = fmaf(qf[u], kf[u], acc);
          }
          sc = acc * p.scale_log2;
        }
        const float mn = fmaxf(m[t], WarpMax(sc));
        const float alpha = exp2f(m[t] - mn);  // m = -inf at first: 0
        const float pr = lane < n ? exp2f(sc - mn) : 0.f;
        l[t] = l[t] * alpha + WarpSum(pr);
        m[t] = mn;
#pragma unroll
        for (int i = 0; i < 4; ++i) o[t][i] *= alpha;
#pragma unroll 4
        for (int j = 0; j < n; ++j) {
          const float pj = __shfl_sync(0xffffffffu, pr, j);
          const uint2 u = *reinterpret_cast<const uint2*>(vr + j * kD + e0);
          const bf16_t* vv = reinterpret_cast<const bf16_t*>(&u);
#pragma unroll
          for (int i = 0; i < 4; ++i) o[t][i] = fmaf(pj, __bfloat162float(vv[i]), o[t][i]);
        }
      }
    };
    const KeyRange keys = plan.Keys(s);
    const int k0 = keys.begin, k1 = keys.end;
    // The cached keys' chunks from the ring, then (last split) the new key: one call site of
    // the chunk's code (the kernel's code size is what an SM's instruction caches hold).
    const int chunks = k1 > k0 ? (k1 - k0 + kChunkKeys - 1) / kChunkKeys : 0;
    for (int i = 0; i < chunks + (last ? 1 : 0); ++i) {
      const bool cached = i < chunks;
      const int n = cached ? min(kChunkKeys, k1 - k0 - i * kChunkKeys) : 1;
      if (cached) ring.WaitFull();
      const bf16_t* kr =
          cached ? reinterpret_cast<const bf16_t*>(smem + (ring.Stage() - SmemAddr(smem))) : new_kv;
      chunk(kr, cached ? kr + kStageBytes / 4 : new_kv + kD, n);
      if (!cached) break;
      ConsumerSync();  // every warp is done with the stage: its sharers' arrivals free it
      if (lane == 0 && warp < ring.Sharers()) MbarArrive(ring.Empty());
      ring.Next();
    }
    Trace(layer, 19);
    // Partials (or, with one split, the output).
    unsigned* head_count = p.sync + kSyncHead + g * 32;
    int* flag = reinterpret_cast<int*>(misc());
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int hh = warp + t * kConsumerWarps;
      if (hh >= group) break;
      if (plan.splits == 1) {
        const float inv = 1.f / l[t];
        bf16_t out[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) out[i] = __float2bfloat16(o[t][i] * inv);
        *reinterpret_cast<uint2*>(p.attn_out + (g * group + hh) * kD + e0) =
            *reinterpret_cast<const uint2*>(out);
      } else {
        float* part = p.attn_part + (static_cast<int64_t>(c) * kMaxGroup + hh) * kPartStride;
        __stcg(reinterpret_cast<float4*>(part + e0),
               make_float4(o[t][0], o[t][1], o[t][2], o[t][3]));
        if (lane == 0) {
          __stcg(part + kD, m[t]);
          __stcg(part + kD + 1, l[t]);
        }
      }
    }
    ConsumerSync();
    if (plan.splits > 1) {
      if (tid == 0) {
        const unsigned done = FetchAddAcqRel(head_count) + 1;
        flag[0] = done == static_cast<unsigned>((layer + 1) * plan.splits);
      }
      ConsumerSync();
      Trace(layer, 20);
      const bool merge = flag[0] != 0;
      if (merge) {
        const int first = g * plan.splits;
        // Every split's (m, l) and o partial loaded at once (16 splits a batch: one trip to L2
        // for up to 16 splits), then summed in split order, rescaled between batches.
        for (int hh = warp; hh < group; hh += kConsumerWarps) {
          auto part = [&](int sp) {
            return p.attn_part + (static_cast<int64_t>(first + sp) * kMaxGroup + hh) * kPartStride;
          };
          constexpr int kBatch = 16;
          float mx = -INFINITY, lsum = 0.f, acc[4] = {};
          for (int sp0 = 0; sp0 < plan.splits; sp0 += kBatch) {
            float4 ov[kBatch];
            float2 ml[kBatch];
#pragma unroll
            for (int u = 0; u < kBatch; ++u) {
              const int sp = min(sp0 + u, plan.splits - 1);
              ov[u] = __ldcg(reinterpret_cast<const float4*>(part(sp) + e0));
              ml[u] = __ldcg(reinterpret_cast<const float2*>(part(sp) + kD));
              if (sp0 + u >= plan.splits) ml[u].x = -INFINITY;  // past the last split: no weight
            }
            float bm = mx;
#pragma unroll
            for (int u = 0; u < kBatch; ++u) bm = fmaxf(bm, ml[u].x);
            const float rescale = mx == -INFINITY ? 0.f : exp2f(mx - bm);
            lsum *= rescale;
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[i] *= rescale;
#pragma unroll
            for (int u = 0; u < kBatch; ++u) {
              const float w = ml[u].x == -INFINITY ? 0.f : exp2f(ml[u].x - bm);
              lsum += w * ml[u].y;
              acc[0] += w * ov[u].x;
              acc[1] += w * ov[u].y;
              acc[2] += w * ov[u].z;
              acc[3] += w * ov[u].w;
            }
            mx = bm;
          }
          const float inv = 1.f / lsum;
          bf16_t out[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) out[i] = __float2bfloat16(acc[i] * inv);
          *reinterpret_cast<uint2*>(p.attn_out + (g * group + hh) * kD + e0) =
              *reinterpret_cast<const uint2*>(out);
        }
        ConsumerSync();
        if (tid == 0) ArriveRelease(p.sync + kSyncMerged);
        Trace(layer, 21);
      }
    } else if (tid == 0) {
      ArriveRelease(p.sync + kSyncMerged);
    }
  }
};

}  // namespace
}  // namespace corolla::cuda
