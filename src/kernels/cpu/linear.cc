// Dense projections through OpenBLAS sgemm (float32; weights were widened at load).
#include <cblas.h>

#include "kernels/cpu/ops.h"

namespace corolla::cpu {

void Linear(const TensorView& x, const TensorView& w, const TensorView& out) {
  COROLLA_CHECK(x.dtype == DType::kF32 && w.dtype == DType::kF32 && out.dtype == DType::kF32)
      << "linear x " << x.ToString() << " w " << w.ToString() << " out " << out.ToString();
  int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  COROLLA_CHECK(w.dim(1) == k && out.dim(0) == m && out.dim(1) == n && w.is_contiguous())
      << "linear x " << x.ToString() << " w " << w.ToString() << " out " << out.ToString();
  if (m == 0) return;
  int64_t ldx = m > 1 ? x.strides[0] : k;
  int64_t ldo = m > 1 ? out.strides[0] : n;
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w.ptr<float>(), k, x.ptr<float>(), 1,
                0.0f, out.ptr<float>(), 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x.ptr<float>(), ldx,
              w.ptr<float>(), k, 0.0f, out.ptr<float>(), ldo);
}

}  // namespace corolla::cpu
