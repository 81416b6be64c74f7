#include "tensor/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

namespace corolla {

Shape::Shape(std::initializer_list<int64_t> d) {
  COROLLA_CHECK(d.size() <= kMaxDims) << "rank " << d.size();
  for (int64_t v : d) dims[rank++] = v;
}

Shape Shape::FromVector(const std::vector<int64_t>& d) {
  COROLLA_CHECK(d.size() <= kMaxDims) << "rank " << d.size();
  Shape s;
  for (int64_t v : d) s.dims[s.rank++] = v;
  return s;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank != o.rank) return false;
  for (int i = 0; i < rank; ++i)
    if (dims[i] != o.dims[i]) return false;
  return true;
}

std::string Shape::ToString() const {
  std::ostringstream s;
  s << "[";
  for (int i = 0; i < rank; ++i) s << (i ? ", " : "") << dims[i];
  s << "]";
  return s.str();
}

TensorView::TensorView(void* data, DType dtype, Shape shape, Device device, int device_idx)
    : data(data), dtype(dtype), shape(shape), device(device), device_idx(device_idx) {
  int64_t stride = 1;
  for (int i = shape.rank - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= shape.dims[i];
  }
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int i = shape.rank - 1; i >= 0; --i) {
    if (shape.dims[i] != 1 && strides[i] != stride) return false;
    stride *= shape.dims[i];
  }
  return true;
}

std::string TensorView::ToString() const {
  std::string name = DTypeName(dtype);
  for (auto& c : name) c = static_cast<char>(std::tolower(c));
  return shape.ToString() + " " + name;
}

TensorView TensorView::Slice(int64_t begin, int64_t end) const {
  COROLLA_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= shape[0])
      << "slice [" << begin << ", " << end << ") of " << ToString();
  TensorView v = *this;
  v.data = static_cast<char*>(data) + begin * strides[0] * DTypeSize(dtype);
  v.shape.dims[0] = end - begin;
  return v;
}

TensorView TensorView::Index(int64_t i) const {
  COROLLA_CHECK(rank() >= 2 && 0 <= i && i < shape[0]) << "index " << i << " of " << ToString();
  TensorView v;
  v.data = static_cast<char*>(data) + i * strides[0] * DTypeSize(dtype);
  v.dtype = dtype;
  v.device = device;
  v.device_idx = device_idx;
  v.shape.rank = rank() - 1;
  for (int d = 1; d < rank(); ++d) {
    v.shape.dims[d - 1] = shape.dims[d];
    v.strides[d - 1] = strides[d];
  }
  return v;
}

TensorView TensorView::Reshape(Shape new_shape) const {
  COROLLA_CHECK(is_contiguous() && new_shape.numel() == numel())
      << "reshape " << ToString() << " to " << new_shape.ToString();
  return TensorView(data, dtype, new_shape, device, device_idx);
}

Tensor Tensor::Empty(DType dtype, Shape shape) {
  size_t bytes = static_cast<size_t>(shape.numel() * DTypeSize(dtype));
  size_t alloc = (bytes + 63) / 64 * 64;
  void* p = alloc ? std::aligned_alloc(64, alloc) : nullptr;
  COROLLA_CHECK(alloc == 0 || p != nullptr) << "out of host memory allocating " << bytes << " bytes";
  Tensor t;
  t.view_ = TensorView(p, dtype, shape);
  t.owner_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return t;
}

Tensor Tensor::Zeros(DType dtype, Shape shape) {
  Tensor t = Empty(dtype, shape);
  if (t.view_.data) std::memset(t.view_.data, 0, t.view_.nbytes());
  return t;
}

Tensor Tensor::Adopt(TensorView view, std::shared_ptr<void> owner) {
  Tensor t;
  t.view_ = view;
  t.owner_ = std::move(owner);
  return t;
}

}  // namespace corolla
