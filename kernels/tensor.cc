#include "kernels/tensor.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/status_macros.h"

namespace shardline::kernels {
namespace {

absl::StatusOr<int64_t> CheckedNumel(std::span<const int64_t> shape) {
  int64_t numel = 1;
  for (int64_t extent : shape) {
    if (extent < 0) {
      return absl::InvalidArgumentError("negative dimension in shape " + ShapeToString(shape));
    }
    if (extent != 0 && numel > INT64_MAX / extent) {
      return absl::InvalidArgumentError("shape " + ShapeToString(shape) + " overflows int64");
    }
    numel *= extent;
  }
  return numel;
}

int64_t Product(std::span<const int64_t> dims) {
  int64_t p = 1;
  for (int64_t d : dims) p *= d;
  return p;
}

absl::Status CheckSliceArgs(const std::vector<int64_t>& shape, int64_t dim, int64_t start,
                            int64_t length) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (dim < 0 || dim >= rank) {
    return absl::InvalidArgumentError("slice dim " + std::to_string(dim) + " out of range for shape " +
                                      ShapeToString(shape));
  }
  if (start < 0 || length < 0 || start > shape[dim] - length) {
    return absl::InvalidArgumentError("slice [" + std::to_string(start) + ", " +
                                      std::to_string(start + length) + ") of dim " +
                                      std::to_string(dim) + " out of range for shape " +
                                      ShapeToString(shape));
  }
  return absl::OkStatus();
}

// Copies `outer` blocks of `block` bytes between two row-major tensors whose blocks lie `src_stride`
// and `dst_stride` bytes apart: the strided part of slicing a non-leading dimension.
void CopyBlocks(const char* src, size_t src_stride, char* dst, size_t dst_stride, int64_t outer,
                size_t block) {
  for (int64_t i = 0; i < outer; ++i) {
    std::memcpy(dst + i * dst_stride, src + i * src_stride, block);
  }
}

}  // namespace

std::string ShapeToString(std::span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ",";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t offset, std::vector<int64_t> shape,
               DType dtype)
    : storage_(std::move(storage)),
      offset_(offset),
      shape_(std::move(shape)),
      numel_(Product(shape_)),
      dtype_(dtype) {}

absl::StatusOr<Tensor> Tensor::Empty(std::vector<int64_t> shape, DType dtype, Allocator& allocator) {
  ASSIGN_OR_RETURN(const int64_t numel, CheckedNumel(shape));
  const size_t nbytes = static_cast<size_t>(numel) * DTypeSize(dtype);
  ASSIGN_OR_RETURN(void* data, allocator.Allocate(nbytes));
  auto storage = std::make_shared<Storage>(data, nbytes, &allocator, allocator.device());
  return Tensor(std::move(storage), 0, std::move(shape), dtype);
}

absl::StatusOr<Tensor> Tensor::Zeros(std::vector<int64_t> shape, DType dtype, Allocator& allocator) {
  ASSIGN_OR_RETURN(Tensor tensor, Empty(std::move(shape), dtype, allocator));
  RETURN_IF_ERROR(allocator.FillZero(tensor.raw_data(), tensor.nbytes()));
  return tensor;
}

absl::StatusOr<Tensor> Tensor::FromBlob(void* data, std::vector<int64_t> shape, DType dtype,
                                        Device device) {
  ASSIGN_OR_RETURN(const int64_t numel, CheckedNumel(shape));
  const size_t nbytes = static_cast<size_t>(numel) * DTypeSize(dtype);
  if (data == nullptr && nbytes > 0) {
    return absl::InvalidArgumentError("FromBlob: null data for shape " + ShapeToString(shape));
  }
  auto storage = std::make_shared<Storage>(data, nbytes, nullptr, device);
  return Tensor(std::move(storage), 0, std::move(shape), dtype);
}

std::string Tensor::DebugString() const {
  if (!defined()) return "undefined";
  return ShapeToString(shape_) + " " + std::string(DTypeName(dtype_)) + " " +
         std::string(DeviceName(device()));
}

void Tensor::BadType(DType wanted) const {
  std::fprintf(stderr, "Tensor::data<%s>() called on a %s tensor\n",
               std::string(DTypeName(wanted)).c_str(), DebugString().c_str());
  std::abort();
}

absl::StatusOr<Tensor> Tensor::Slice(int64_t dim, int64_t start, int64_t length) const {
  RETURN_IF_ERROR(CheckSliceArgs(shape_, dim, start, length));
  const std::span<const int64_t> leading(shape_.data(), static_cast<size_t>(dim));
  if (Product(leading) != 1) {
    return absl::InvalidArgumentError(
        "Slice along dim " + std::to_string(dim) + " of " + ShapeToString(shape_) +
        " is not contiguous (a leading dimension is larger than 1); use SliceCopy");
  }
  const std::span<const int64_t> trailing(shape_.data() + dim + 1, shape_.size() - dim - 1);
  const size_t offset =
      offset_ + static_cast<size_t>(start * Product(trailing)) * DTypeSize(dtype_);
  std::vector<int64_t> shape = shape_;
  shape[dim] = length;
  return Tensor(storage_, offset, std::move(shape), dtype_);
}

absl::StatusOr<Tensor> Tensor::SliceCopy(int64_t dim, int64_t start, int64_t length,
                                         Allocator& allocator) const {
  RETURN_IF_ERROR(CheckSliceArgs(shape_, dim, start, length));
  if (device() != Device::kCpu || allocator.device() != Device::kCpu) {
    return absl::UnimplementedError("SliceCopy is CPU only; got " + DebugString());
  }
  std::vector<int64_t> shape = shape_;
  shape[dim] = length;
  ASSIGN_OR_RETURN(Tensor out, Empty(shape, dtype_, allocator));
  const int64_t outer = Product(std::span<const int64_t>(shape_.data(), dim));
  const size_t inner_bytes =
      static_cast<size_t>(Product(std::span<const int64_t>(shape_.data() + dim + 1,
                                                           shape_.size() - dim - 1))) *
      DTypeSize(dtype_);
  CopyBlocks(static_cast<const char*>(raw_data()) + start * inner_bytes, shape_[dim] * inner_bytes,
             static_cast<char*>(out.raw_data()), length * inner_bytes, outer, length * inner_bytes);
  return out;
}

absl::Status Tensor::CopyIntoSlice(int64_t dim, int64_t start, const Tensor& src) {
  if (!defined() || !src.defined()) {
    return absl::InvalidArgumentError("CopyIntoSlice: undefined tensor");
  }
  if (dim < 0 || dim >= this->dim() || src.dim() != this->dim() || src.dtype_ != dtype_) {
    return absl::InvalidArgumentError("CopyIntoSlice: cannot write " + src.DebugString() +
                                      " into dim " + std::to_string(dim) + " of " + DebugString());
  }
  for (int64_t d = 0; d < this->dim(); ++d) {
    if (d != dim && src.shape_[d] != shape_[d]) {
      return absl::InvalidArgumentError("CopyIntoSlice: " + src.DebugString() +
                                        " does not match " + DebugString() + " outside dim " +
                                        std::to_string(dim));
    }
  }
  RETURN_IF_ERROR(CheckSliceArgs(shape_, dim, start, src.shape_[dim]));
  if (device() != Device::kCpu || src.device() != Device::kCpu) {
    return absl::UnimplementedError("CopyIntoSlice is CPU only; got " + DebugString());
  }
  const int64_t outer = Product(std::span<const int64_t>(shape_.data(), dim));
  const size_t inner_bytes =
      static_cast<size_t>(Product(std::span<const int64_t>(shape_.data() + dim + 1,
                                                           shape_.size() - dim - 1))) *
      DTypeSize(dtype_);
  const int64_t length = src.shape_[dim];
  // memmove semantics are not needed: a slice of this tensor written into itself would be a
  // caller bug, and memcpy of disjoint blocks is what every real use does.
  CopyBlocks(static_cast<const char*>(src.raw_data()), length * inner_bytes,
             static_cast<char*>(raw_data()) + start * inner_bytes, shape_[dim] * inner_bytes, outer,
             length * inner_bytes);
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Tensor::Reshape(std::vector<int64_t> shape) const {
  ASSIGN_OR_RETURN(const int64_t numel, CheckedNumel(shape));
  if (numel != numel_) {
    return absl::InvalidArgumentError("cannot reshape " + ShapeToString(shape_) + " to " +
                                      ShapeToString(shape) + ": element counts differ");
  }
  return Tensor(storage_, offset_, std::move(shape), dtype_);
}

absl::StatusOr<Tensor> Tensor::CastCopy(DType dtype, Allocator& allocator) const {
  if (device() != Device::kCpu || allocator.device() != Device::kCpu) {
    return absl::UnimplementedError("CastCopy is CPU only; got " + DebugString());
  }
  ASSIGN_OR_RETURN(Tensor out, Empty(shape_, dtype, allocator));
  const size_t n = static_cast<size_t>(numel_);
  if (dtype == dtype_) {
    if (n > 0) std::memcpy(out.raw_data(), raw_data(), nbytes());
  } else if (dtype_ == DType::kFloat32 && dtype == DType::kBFloat16) {
    FloatToBFloat16(data<float>(), out.data<BFloat16>(), n);
  } else if (dtype_ == DType::kBFloat16 && dtype == DType::kFloat32) {
    BFloat16ToFloat(data<BFloat16>(), out.data<float>(), n);
  } else if (dtype_ == DType::kFloat32 && dtype == DType::kFloat16) {
    FloatToFloat16(data<float>(), out.data<Float16>(), n);
  } else if (dtype_ == DType::kFloat16 && dtype == DType::kFloat32) {
    Float16ToFloat(data<Float16>(), out.data<float>(), n);
  } else {
    return absl::UnimplementedError("CastCopy from " + std::string(DTypeName(dtype_)) + " to " +
                                    std::string(DTypeName(dtype)));
  }
  return out;
}

absl::Status ExpectShape(const Tensor& tensor, std::span<const int64_t> shape, DType dtype,
                         std::string_view what) {
  const bool same_shape = tensor.defined() && tensor.shape().size() == shape.size() &&
                          std::equal(shape.begin(), shape.end(), tensor.shape().begin());
  if (same_shape && tensor.dtype() == dtype) return absl::OkStatus();
  return absl::InvalidArgumentError(
      std::string(what) + ": shape " +
      (tensor.defined() ? ShapeToString(tensor.shape()) + " " + std::string(DTypeName(tensor.dtype()))
                        : std::string("undefined")) +
      ", expected " + ShapeToString(shape) + " " + std::string(DTypeName(dtype)));
}

}  // namespace shardline::kernels
