// The device-side tile schedule the grouped GEMMs (grouped_gemm.cu: mma.sync;
// grouped_gemm_wgmma.cu: wgmma + TMA; moe_fp8.cu / moe_fp8_wgmma.cu: e4m3) share: offsets [E + 1]
// -> each expert's first m-tile in shared memory, and tile index -> (expert, rows, first output
// column); and the cp.async / ldmatrix wrappers, shared-memory swizzle and epilogue of the mma.sync
// ones. Device code only.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace corolla::cuda::grouped {

// Shared-memory copy of offsets and each expert's first m-tile (kBM rows): tiles of expert e
// are [tile_start[e], tile_start[e + 1]); tile_start[E] is the number of m-tiles.
struct Schedule {
  const int32_t* offsets;     // [E + 1], shared
  const int32_t* tile_start;  // [E + 1], shared
  int experts, n_tiles;
};

struct TileCoord {
  // rows: valid rows of the tile (<= kBM); n0: its first output column.
  int expert, row_begin, rows, n0;
};

// Tile `tile` in (m-tile, n-tile) order, n fastest.
template <int kBM, int kNPerTile>
__device__ __forceinline__ TileCoord Locate(const Schedule& sch, int tile) {
  const int mt = tile / sch.n_tiles, nb = tile - mt * sch.n_tiles;
  int lo = 0, hi = sch.experts - 1;  // the expert e with tile_start[e] <= mt < tile_start[e + 1]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (sch.tile_start[mid] <= mt)
      lo = mid;
    else
      hi = mid - 1;
  }
  TileCoord t;
  t.expert = lo;
  t.row_begin = sch.offsets[lo] + (mt - sch.tile_start[lo]) * kBM;
  t.rows = min(kBM, sch.offsets[lo + 1] - t.row_begin);
  t.n0 = nb * kNPerTile;
  return t;
}

// The tile a persistent CTA takes in its round r (its r-th tile, increasing in r): rounds of
// gridDim.x tiles in alternating directions (snake), or blockIdx.x + r gridDim.x. The tiles of a
// group repeat with a period (an expert's full m-tile, then its partial one, n fastest: 2 n_tiles
// tiles an expert where routing is even); where the grid is a multiple of that period, the
// straight order gives each CTA the same place of it in every round, so that some CTAs run only
// full tiles and the others only partial ones (132 CTAs, 6 n-tiles: half the SMs idle for half
// the kernel). The snake alternates each CTA between two places.
__device__ __forceinline__ int RoundTile(int r, bool snake) {
  const int c = blockIdx.x, grid = gridDim.x;
  return r * grid + (snake && (r & 1) != 0 ? grid - 1 - c : c);
}

// Warp 0: tile_start from offsets (lane l sums a contiguous run of experts, then a shuffle scan).
template <int kBM>
__device__ void ScanTiles(const int32_t* offsets, int32_t* tile_start, int experts, int lane) {
  const int per = (experts + 31) / 32;
  const int lo = min(lane * per, experts), hi = min(lo + per, experts);
  int sum = 0;
  for (int e = lo; e < hi; ++e) sum += (offsets[e + 1] - offsets[e] + kBM - 1) / kBM;
  int incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  int run = incl - sum;
  for (int e = lo; e < hi; ++e) {
    tile_start[e] = run;
    run += (offsets[e + 1] - offsets[e] + kBM - 1) / kBM;
  }
  if (lane == 31) tile_start[experts] = incl;
}

// ---- loads of the mma.sync kernels (addresses as 32-bit shared-memory offsets) -------------
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, bypassing L1; src_bytes 0 writes zeros (src is not read).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}
// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and register i of
// lane l receives row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 of matrix i.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Byte offset of 16-byte chunk `chunk` of tile row `row` (128-byte rows, XOR swizzle).
__device__ __forceinline__ uint32_t Swizzled(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// ---- the epilogue of the mma.sync kernels ----------------------------------------------------
// Writes a warp's accumulators acc[kMT][kNT][4] of tile t (accumulator i of m16n8 tile (mt, nt):
// row row0 + 16 mt + lane / 4 + 8 (i / 2), column col0 + 8 nt + 2 (lane % 4) + i % 2) to out
// [.., n], row r of the tile at row t.row_begin + r. GateUp: n8-tiles nt < kNT / 2 are gate
// columns, nt + kNT / 2 their up columns: silu(g) * u in bf16 pairs. Down: y in f32 pairs, or in
// bf16 (out_bf16) 16 bytes a lane through StoreFragmentBf16. Rows >= t.rows and columns >= n (a
// multiple of 8) are not written. The whole warp must call it.
template <bool kGateUp, int kMT, int kNT>
__device__ __forceinline__ void MmaEpilogue(const float (&acc)[kMT][kNT][4], void* out,
                                            bool out_bf16, int n, const TileCoord& t, int row0,
                                            int col0) {
  const int lane = threadIdx.x % 32;
  if (!kGateUp && out_bf16) {
    bf16_t* y = static_cast<bf16_t*>(out) + static_cast<int64_t>(t.row_begin) * n;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
      StoreFragmentBf16<kNT>(y, n, t.rows, row0 + mt * 16 + lane / 4, col0, [&](int nt, int h) {
        return __floats2bfloat162_rn(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
      });
    return;
  }
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + mt * 16 + lane / 4 + 8 * h;
      if (r >= t.rows) continue;
      const int64_t out_row = static_cast<int64_t>(t.row_begin + r) * n;
      if constexpr (kGateUp) {
#pragma unroll
        for (int nt = 0; nt < kNT / 2; ++nt) {
          const int col = col0 + 8 * nt + 2 * (lane % 4);
          if (col >= n) continue;  // n % 8 == 0: col < n implies col + 1 < n
          const float g0 = acc[mt][nt][2 * h], g1 = acc[mt][nt][2 * h + 1];
          const float u0 = acc[mt][nt + kNT / 2][2 * h], u1 = acc[mt][nt + kNT / 2][2 * h + 1];
          *reinterpret_cast<__nv_bfloat162*>(static_cast<bf16_t*>(out) + out_row + col) =
              __floats2bfloat162_rn(g0 / (1.f + expf(-g0)) * u0, g1 / (1.f + expf(-g1)) * u1);
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const int col = col0 + 8 * nt + 2 * (lane % 4);
          if (col >= n) continue;
          *reinterpret_cast<float2*>(static_cast<float*>(out) + out_row + col) =
              make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
        }
      }
    }
}

}  // namespace corolla::cuda::grouped
