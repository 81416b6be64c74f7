// Element types of tensors, as named in safetensors headers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace corolla {

enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kI32, kI64, kU8 };

inline int64_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kF8E4M3: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  return 0;
}

// Safetensors spelling: "F32", "BF16", "F16", "F8_E4M3", "I32", "I64", "U8".
const char* DTypeName(DType t);
bool ParseDType(std::string_view name, DType* out);

}  // namespace corolla
