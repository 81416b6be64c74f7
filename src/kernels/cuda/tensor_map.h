// TMA tensor maps (CUtensorMap, read by cp.async.bulk.tensor: wgmma.cuh's TmaLoad2d) built on
// the host: the driver's cuTensorMapEncodeTiled through the runtime's entry-point query (no
// libcuda link) and a cache of 2-D maps, so a kernel's maps are encoded once per tensor. Shared
// by the wgmma kernels (grouped GEMMs, FP8 grouped GEMMs, prefill attention). Thread-safe.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

namespace corolla::cuda {

// cuTensorMapEncodeTiled of the installed driver (CHECK-fails if it has none).
PFN_cuTensorMapEncodeTiled_v12000 EncodeTiled();

// The map of a row-major 2-D tensor at `base`: `rows` rows of `cols` elements of `dtype`,
// `row_bytes` apart (a multiple of 16; base 16-byte aligned); box `box_cols` x `box_rows`
// (box_cols x element size <= 128), 128-byte swizzle, L2 promotion 256 B, boxes past the end
// zero-filled. Cached per (base, dtype, shape, stride, box). CHECK-fails if the driver refuses
// it; `what` names the caller in that message.
CUtensorMap TensorMap2dSw128(const void* base, CUtensorMapDataType dtype, int64_t rows, int64_t cols,
                             int64_t row_bytes, uint32_t box_cols, uint32_t box_rows, const char* what);

}  // namespace corolla::cuda
