// Element types shared by tensors, kernels and communicators.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shardline {

enum class DType : uint8_t { kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64 };

size_t DTypeSize(DType dtype);
std::string_view DTypeName(DType dtype);  // "f32", "f64", "bf16", "f16", "i32", "i64"

}  // namespace shardline
