// TensorView: a non-owning, typed, strided view of memory on one device (up to 4 dims).
// Tensor: a TensorView that owns its storage (host memory here; device storage comes from a
// Backend allocator). Views are plain values; whoever owns the storage must outlive them.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "base/check.h"
#include "tensor/dtype.h"

namespace corolla {

enum class Device : uint8_t { kCpu, kCuda };

constexpr int kMaxDims = 4;

struct Shape {
  std::array<int64_t, kMaxDims> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d);
  static Shape FromVector(const std::vector<int64_t>& d);
  int64_t operator[](int i) const { return dims[i]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string ToString() const;  // "[128, 2048]"
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  std::array<int64_t, kMaxDims> strides{};  // in elements
  Device device = Device::kCpu;
  int device_idx = 0;

  TensorView() = default;
  TensorView(void* data, DType dtype, Shape shape, Device device = Device::kCpu, int device_idx = 0);

  int rank() const { return shape.rank; }
  int64_t dim(int i) const { return shape[i < 0 ? i + shape.rank : i]; }
  int64_t numel() const { return shape.numel(); }
  int64_t nbytes() const { return numel() * DTypeSize(dtype); }
  bool is_contiguous() const;
  std::string ToString() const;  // "[128, 2048] bf16"

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }

  // Rows [begin, end) of the leading dimension.
  TensorView Slice(int64_t begin, int64_t end) const;
  // Element `i` of the leading dimension, as a view of rank-1.
  TensorView Index(int64_t i) const;
  // Same data, new shape; requires a contiguous view with the same element count.
  TensorView Reshape(Shape new_shape) const;
};

// Owning host tensor (64-byte aligned), or a wrapper around device memory freed by `deleter`.
class Tensor {
 public:
  Tensor() = default;
  static Tensor Empty(DType dtype, Shape shape);  // host, uninitialised
  static Tensor Zeros(DType dtype, Shape shape);  // host
  // Takes ownership of `data` (any device) released with `deleter`.
  static Tensor Adopt(TensorView view, std::shared_ptr<void> owner);

  const TensorView& view() const { return view_; }
  // The same storage under a new shape (contiguous, same element count).
  Tensor Reshaped(Shape shape) const {
    Tensor t = *this;
    t.view_ = view_.Reshape(shape);
    return t;
  }
  operator const TensorView&() const { return view_; }  // NOLINT: a tensor is usable as a view
  bool defined() const { return view_.data != nullptr || view_.rank() > 0; }
  template <typename T>
  T* ptr() const { return view_.ptr<T>(); }
  const Shape& shape() const { return view_.shape; }
  DType dtype() const { return view_.dtype; }
  int64_t numel() const { return view_.numel(); }
  int64_t dim(int i) const { return view_.dim(i); }

 private:
  TensorView view_;
  std::shared_ptr<void> owner_;
};

}  // namespace corolla
