#include "tensor/dtype.h"

namespace corolla {

namespace {
struct Entry {
  DType dtype;
  const char* name;
};
constexpr Entry kEntries[] = {
    {DType::kF32, "F32"},   {DType::kBF16, "BF16"}, {DType::kF16, "F16"}, {DType::kF8E4M3, "F8_E4M3"},
    {DType::kI32, "I32"},   {DType::kI64, "I64"},   {DType::kU8, "U8"},
};
}  // namespace

const char* DTypeName(DType t) {
  for (const auto& e : kEntries)
    if (e.dtype == t) return e.name;
  return "?";
}

bool ParseDType(std::string_view name, DType* out) {
  for (const auto& e : kEntries) {
    if (name == e.name) {
      *out = e.dtype;
      return true;
    }
  }
  return false;
}

}  // namespace corolla
