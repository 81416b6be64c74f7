// Grouped expert GEMMs for decode batches as weight streams (moe_skinny.h). A CTA of
// skinny::kWarps warps takes one expert slot (blockIdx.y: the slot-th active expert; CTAs past
// the active experts exit at once) and kWarps / k_parts of its warp tiles; a warp tile is 16 rows
// of the expert's weights, streamed over its share of K into mma.sync against up to 16 of the
// expert's permuted rows at a time (skinny_stream.cuh):
//   GateUp: tile j0 = 8 tile holds gate rows j0..j0+7 as the mma's rows 0-7 and up rows
//           I+j0..I+j0+7 as rows 8-15, so a lane holds gate and up of the same (row, j) and
//           writes bf16(silu(g) * u) from registers;
//   Down:   tile holds W_down rows 16 tile..16 tile+15; y as f32 or bf16.
// An expert with more than 16 rows takes further passes over its weights (decode batches rarely
// put more than 16 tokens on one expert; the grouped GEMMs take the large batches).
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_skinny.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/skinny_stream.cuh"
#include "kernels/cuda/timeline.cuh"
#include "kernels/cuda/timeline.h"

namespace corolla::cuda {
namespace {

constexpr int kRowTiles = 2;  // 16 of an expert's rows a pass

struct SkinnyExpertsParams {
  const bf16_t* a;  // GateUp: x [T, K] through perm_token; Down: act [TK, K]
  int64_t a_stride;
  const int32_t* perm_token;  // GateUp only
  const bf16_t* w;  // [E, N_w, K]: GateUp N_w = 2 N (gate rows, then up rows); Down N_w = N
  void* out;        // GateUp: act [TK, N] bf16; Down: y [TK, N]
  bool out_f32;
  const int32_t* offsets;
  const int32_t* active;  // [E + 1], MoePermutation's
  int experts, n, k;
  int tiles;    // warp tiles an expert: GateUp ceil(N / 8), Down ceil(N / 16)
  int k_parts;  // warps a tile (a power of two <= skinny::kWarps)
  int k_part;   // columns a warp (a multiple of skinny::kStep)
  uint64_t* timeline = nullptr;
};

template <bool kGateUp>
__global__ void __launch_bounds__(skinny::kWarps * 32, 2)
    SkinnyExpertsKernel(const __grid_constant__ SkinnyExpertsParams p) {
  __shared__ float4 partial[skinny::kWarps][kRowTiles][32];
  TimelineScope tl(p.timeline);
  GridDependencyWait();  // the permutation and the rows are earlier kernels' outputs
  tl.Waited();
  TriggerDependents();
  if (static_cast<int>(blockIdx.y) >= p.active[p.experts]) return;
  const int e = p.active[blockIdx.y];
  const int row_begin = p.offsets[e], count = p.offsets[e + 1] - row_begin;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int tile = blockIdx.x * (skinny::kWarps / p.k_parts) + warp / p.k_parts;
  const bool active = tile < p.tiles;
  const int k_begin = (warp % p.k_parts) * p.k_part, k_end = min(p.k, k_begin + p.k_part);
  // The lane's two weight rows; rows past N repeat row N - 1 (their outputs are dropped).
  const bf16_t* w = p.w + static_cast<int64_t>(e) * (kGateUp ? 2 : 1) * p.n * p.k;
  int lo, hi;
  if constexpr (kGateUp) {
    lo = min(tile * 8 + g, p.n - 1);
    hi = p.n + lo;
  } else {
    lo = min(tile * 16 + g, p.n - 1);
    hi = min(tile * 16 + g + 8, p.n - 1);
  }
  const bf16_t* w_lo = w + static_cast<int64_t>(lo) * p.k + 8 * c;
  const bf16_t* w_hi = w + static_cast<int64_t>(hi) * p.k + 8 * c;
  for (int r0 = 0; r0 < count; r0 += 8 * kRowTiles) {  // the same count in every thread
    int src[kRowTiles];  // the lane's row of each row tile in a (x: the token), -1 past the
                         // expert's
#pragma unroll
    for (int t = 0; t < kRowTiles; ++t) {
      const int r = r0 + g + 8 * t;
      src[t] = r >= count ? -1 : kGateUp ? p.perm_token[row_begin + r] : row_begin + r;
    }
    auto has_row = [&](int t) { return src[t] >= 0; };
    auto x_row = [&](int t) { return p.a + static_cast<int64_t>(src[t]) * p.a_stride + 8 * c; };
    skinny::WBlocks wb;
    skinny::LoadW(w_lo, w_hi, active, k_begin, k_end, wb);
    float acc[kRowTiles][4] = {};
    skinny::Stream<kRowTiles>(wb, w_lo, w_hi, active, has_row, x_row, k_begin, k_end, acc);
    skinny::StoreParts<kRowTiles>(partial, acc);
    if (active && warp % p.k_parts == 0) {
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t) {
        const float4 v = skinny::PartsSum<kRowTiles>(partial, t, p.k_parts);
        const float s[4] = {v.x, v.y, v.z,
                            v.w};  // {(lo, 2c), (lo, 2c + 1), (hi, 2c), (hi, 2c + 1)}
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int r = r0 + 8 * t + 2 * c + q;
          if (r >= count) continue;
          const int64_t row = row_begin + r;
          if constexpr (kGateUp) {
            const int j = tile * 8 + g;
            const float gate = s[q], up = s[2 + q];
            if (j < p.n)
              static_cast<bf16_t*>(p.out)[row * p.n + j] =
                  __float2bfloat16(gate / (1.f + expf(-gate)) * up);
          } else {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int col = tile * 16 + g + 8 * half;
              if (col >= p.n) continue;
              const float v = s[q + 2 * half];
              if (p.out_f32)
                static_cast<float*>(p.out)[row * p.n + col] = v;
              else
                static_cast<bf16_t*>(p.out)[row * p.n + col] = __float2bfloat16(v);
            }
          }
        }
      }
    }
    __syncthreads();  // `partial` is the next pass's
  }
}

// Splits K over a tile's warps (a power of two up to a CTA's) until the grid has
// skinny::kTargetWarps warps, while a warp keeps at least one step of columns.
int KParts(int64_t tiles, int64_t k) {
  int parts = 1;
  while (parts < skinny::kWarps && tiles * parts < skinny::kTargetWarps &&
         k > int64_t{parts} * skinny::kStep)
    parts *= 2;
  return parts;
}

template <bool kGateUp>
void Launch(SkinnyExpertsParams p, int slots, const char* name, cudaStream_t s) {
  p.k_parts = KParts(int64_t{p.tiles} * slots, p.k);
  p.k_part =
      static_cast<int>(CeilDiv(CeilDiv(int64_t{p.k}, p.k_parts), skinny::kStep) * skinny::kStep);
  const dim3 grid(static_cast<unsigned>(CeilDiv(int64_t{p.tiles}, skinny::kWarps / p.k_parts)),
                  static_cast<unsigned>(slots));
  if (TimelineOn()) p.timeline = TimelineRecord(name, int64_t{grid.x} * grid.y, s);
  LaunchPdl(SkinnyExpertsKernel<kGateUp>, grid, dim3(skinny::kWarps * 32), 0, s, 1, p);
}

}  // namespace

void SkinnyExpertsGateUp(const TensorView& x, const int32_t* perm_token, const int32_t* offsets,
                         const int32_t* active, int slots, const TensorView& w_gate_up,
                         const TensorView& act, cudaStream_t s) {
  const int64_t inter = act.dim(1), hidden = x.dim(1);
  const int64_t x_stride = x.dim(0) > 1 ? x.strides[0] : hidden;
  COROLLA_CHECK(x.dtype == DType::kBF16 && w_gate_up.dtype == DType::kBF16 &&
                act.dtype == DType::kBF16 && x.rank() == 2 && x.strides[1] == 1 &&
                x_stride % 8 == 0 && Aligned16(x.data) && w_gate_up.rank() == 3 &&
                w_gate_up.is_contiguous() && Aligned16(w_gate_up.data) &&
                w_gate_up.dim(1) == 2 * inter && w_gate_up.dim(2) == hidden &&
                act.is_contiguous() && hidden % 8 == 0 && slots > 0)
      << "skinny experts gate_up: x " << x.ToString() << " w " << w_gate_up.ToString() << " act "
      << act.ToString();
  SkinnyExpertsParams p{x.ptr<bf16_t>(),
                        x_stride,
                        perm_token,
                        w_gate_up.ptr<bf16_t>(),
                        act.data,
                        false,
                        offsets,
                        active,
                        static_cast<int>(w_gate_up.dim(0)),
                        static_cast<int>(inter),
                        static_cast<int>(hidden),
                        static_cast<int>(CeilDiv(inter, 8)),
                        1,
                        0};
  Launch<true>(p, slots, "SkinnyExpertsGateUp", s);
}

void SkinnyExpertsDown(const TensorView& act, const int32_t* offsets, const int32_t* active,
                       int slots, const TensorView& w_down, const TensorView& y, cudaStream_t s) {
  const int64_t inter = act.dim(1), hidden = w_down.dim(1);
  COROLLA_CHECK(act.dtype == DType::kBF16 && act.rank() == 2 && act.is_contiguous() &&
                Aligned16(act.data) && inter % 8 == 0 && w_down.dtype == DType::kBF16 &&
                w_down.rank() == 3 && w_down.is_contiguous() && Aligned16(w_down.data) &&
                w_down.dim(2) == inter && (y.dtype == DType::kF32 || y.dtype == DType::kBF16) &&
                y.is_contiguous() && y.dim(1) == hidden && slots > 0)
      << "skinny experts down: act " << act.ToString() << " w " << w_down.ToString() << " y "
      << y.ToString();
  SkinnyExpertsParams p{act.ptr<bf16_t>(),
                        inter,
                        nullptr,
                        w_down.ptr<bf16_t>(),
                        y.data,
                        y.dtype == DType::kF32,
                        offsets,
                        active,
                        static_cast<int>(w_down.dim(0)),
                        static_cast<int>(hidden),
                        static_cast<int>(inter),
                        static_cast<int>(CeilDiv(hidden, 16)),
                        1,
                        0};
  Launch<false>(p, slots, "SkinnyExpertsDown", s);
}

}  // namespace corolla::cuda
