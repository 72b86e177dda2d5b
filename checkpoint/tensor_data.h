// Tensors as checkpoint files see them: a name, a safetensors dtype, a shape and raw little-endian
// bytes, row-major. Deliberately not kernels' Tensor, so checkpoint I/O builds and tests alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace shardline::checkpoint {

// Every dtype of the safetensors format; "SafetensorsDType" rather than "DType" to stay apart
// from kernels' shardline::DType.
enum class SafetensorsDType : uint8_t {
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kU32,
  kI32,
  kU64,
  kI64,
  kF16,
  kBF16,
  kF32,
  kF64,
  kF8E4M3,
  kF8E5M2,
};

// The name as written in a file header: "F32", "BF16", "I64", "F8_E4M3", ...
const char* DTypeName(SafetensorsDType dtype);
size_t DTypeSize(SafetensorsDType dtype);
// nullopt for a name the format does not define.
std::optional<SafetensorsDType> ParseDType(std::string_view name);

// F32, F64, F16 or BF16: the dtypes weights may be stored in.
bool IsFloatDType(SafetensorsDType dtype);

// The product of `shape` (1 for a scalar), or nullopt when a dimension is negative or it overflows.
std::optional<uint64_t> NumElements(std::span<const int64_t> shape);
// "[3, 4]", for messages.
std::string ShapeString(std::span<const int64_t> shape);

// A tensor whose bytes live elsewhere; the bytes must outlive every use of the view.
struct TensorView {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;
};

// An fp32 tensor in host memory: what loaders hand to the model (master weights are fp32).
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;

  TensorView View(std::string name) const {
    return TensorView{std::move(name), SafetensorsDType::kF32, shape,
                      std::as_bytes(std::span<const float>(values))};
  }
};

// fp16 / bf16 bit patterns to float, exactly (every fp16 and bf16 value is a float).
float HalfToFloat(uint16_t bits);
float BFloat16ToFloat(uint16_t bits);

// Converts `count` elements of `dtype` at `data` to float. False for dtypes that are not floating
// point (integers are not weights; converting them silently would hide a wrong file).
bool ConvertToFloat(SafetensorsDType dtype, const std::byte* data, size_t count, float* out);

}  // namespace shardline::checkpoint
