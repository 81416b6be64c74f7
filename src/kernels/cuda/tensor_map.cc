// TMA tensor maps: see tensor_map.h.
#include "kernels/cuda/tensor_map.h"

#include <map>
#include <mutex>
#include <tuple>

#include "base/check.h"
#include "kernels/cuda/cuda_check.h"

namespace corolla::cuda {

PFN_cuTensorMapEncodeTiled_v12000 EncodeTiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    COROLLA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                        cudaEnableDefault, &found));
    COROLLA_CHECK(found == cudaDriverEntryPointSuccess && f != nullptr)
        << "the driver has no cuTensorMapEncodeTiled";
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

CUtensorMap TensorMap2dSw128(const void* base, CUtensorMapDataType dtype, int64_t rows, int64_t cols,
                             int64_t row_bytes, uint32_t box_cols, uint32_t box_rows, const char* what) {
  using Key = std::tuple<const void*, int, int64_t, int64_t, int64_t, uint32_t, uint32_t>;
  static std::mutex mu;
  static std::map<Key, CUtensorMap> cache;
  const Key key{base, static_cast<int>(dtype), rows, cols, row_bytes, box_cols, box_rows};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};  // bytes, dims 1..
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      EncodeTiled()(&map, dtype, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  COROLLA_CHECK(r == CUDA_SUCCESS) << what << ": cuTensorMapEncodeTiled of [" << rows << ", " << cols
                                   << "] (type " << static_cast<int>(dtype) << ", row " << row_bytes
                                   << " bytes, box " << box_cols << " x " << box_rows << ") failed ("
                                   << static_cast<int>(r) << ")";
  cache.emplace(key, map);
  return map;
}

}  // namespace corolla::cuda
