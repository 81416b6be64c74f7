#include "tensor/tensor.h"

#include <gtest/gtest.h>

namespace corolla {
namespace {

TEST(Tensor, ViewsSliceIndexReshape) {
  Tensor t = Tensor::Empty(DType::kF32, {4, 3, 2});
  for (int i = 0; i < 24; ++i) t.ptr<float>()[i] = static_cast<float>(i);
  EXPECT_EQ(t.view().ToString(), "[4, 3, 2] f32");
  EXPECT_TRUE(t.view().is_contiguous());
  TensorView rows = t.view().Slice(1, 3);
  EXPECT_EQ(rows.shape, (Shape{2, 3, 2}));
  EXPECT_EQ(rows.ptr<float>()[0], 6.0f);
  TensorView row = t.view().Index(2);
  EXPECT_EQ(row.shape, (Shape{3, 2}));
  EXPECT_EQ(row.ptr<float>()[5], 17.0f);
  TensorView flat = t.view().Reshape({12, 2});
  EXPECT_EQ(flat.strides[0], 2);
  Tensor r = t.Reshaped({24});
  EXPECT_EQ(r.ptr<float>(), t.ptr<float>());
  EXPECT_EQ(Shape({2, 3}).numel(), 6);
  EXPECT_NE(Shape({2, 3}), Shape({3, 2}));
}

TEST(Tensor, DTypeNames) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kI32, DType::kI64, DType::kU8}) {
    DType parsed;
    ASSERT_TRUE(ParseDType(DTypeName(t), &parsed));
    EXPECT_EQ(parsed, t);
  }
  DType parsed;
  EXPECT_FALSE(ParseDType("F64", &parsed));
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1);
}

}  // namespace
}  // namespace corolla
