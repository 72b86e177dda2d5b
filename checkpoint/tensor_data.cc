#include "checkpoint/tensor_data.h"

#include <array>
#include <bit>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardline::checkpoint {
namespace {

// Safetensors stores little-endian bytes; we read them in place.
static_assert(std::endian::native == std::endian::little,
              "checkpoint I/O assumes a little-endian host");

struct DTypeEntry {
  SafetensorsDType dtype;
  const char* name;
  size_t size;
};

constexpr std::array<DTypeEntry, 15> kDTypes = {{
    {SafetensorsDType::kBool, "BOOL", 1},
    {SafetensorsDType::kU8, "U8", 1},
    {SafetensorsDType::kI8, "I8", 1},
    {SafetensorsDType::kU16, "U16", 2},
    {SafetensorsDType::kI16, "I16", 2},
    {SafetensorsDType::kU32, "U32", 4},
    {SafetensorsDType::kI32, "I32", 4},
    {SafetensorsDType::kU64, "U64", 8},
    {SafetensorsDType::kI64, "I64", 8},
    {SafetensorsDType::kF16, "F16", 2},
    {SafetensorsDType::kBF16, "BF16", 2},
    {SafetensorsDType::kF32, "F32", 4},
    {SafetensorsDType::kF64, "F64", 8},
    {SafetensorsDType::kF8E4M3, "F8_E4M3", 1},
    {SafetensorsDType::kF8E5M2, "F8_E5M2", 1},
}};

const DTypeEntry& Entry(SafetensorsDType dtype) { return kDTypes[static_cast<size_t>(dtype)]; }

}  // namespace

const char* DTypeName(SafetensorsDType dtype) { return Entry(dtype).name; }
size_t DTypeSize(SafetensorsDType dtype) { return Entry(dtype).size; }

std::optional<SafetensorsDType> ParseDType(std::string_view name) {
  for (const DTypeEntry& entry : kDTypes) {
    if (name == entry.name) return entry.dtype;
  }
  return std::nullopt;
}

bool IsFloatDType(SafetensorsDType dtype) {
  return dtype == SafetensorsDType::kF32 || dtype == SafetensorsDType::kF64 ||
         dtype == SafetensorsDType::kF16 || dtype == SafetensorsDType::kBF16;
}

std::optional<uint64_t> NumElements(std::span<const int64_t> shape) {
  uint64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(dim), &count)) return std::nullopt;
  }
  return count;
}

std::string ShapeString(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t result;
  if (exponent == 0x1f) {  // inf / nan keep their payload
    result = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    result = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    result = sign;
  } else {  // subnormal half: normalize, since it is a normal float
    uint32_t shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    result = sign | ((113 - shift) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(result);
}

float BFloat16ToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

bool ConvertToFloat(SafetensorsDType dtype, const std::byte* data, size_t count, float* out) {
  switch (dtype) {
    case SafetensorsDType::kF32:
      // An empty tensor's buffers may be null, which memcpy may not be given even for 0 bytes.
      if (count > 0) std::memcpy(out, data, count * sizeof(float));
      return true;
    case SafetensorsDType::kF64:
      for (size_t i = 0; i < count; ++i) {
        double value;
        std::memcpy(&value, data + i * sizeof(double), sizeof(double));
        out[i] = static_cast<float>(value);
      }
      return true;
    case SafetensorsDType::kF16:
    case SafetensorsDType::kBF16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, data + i * 2, 2);
        out[i] = dtype == SafetensorsDType::kF16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
      }
      return true;
    default:
      return false;
  }
}

}  // namespace shardline::checkpoint
