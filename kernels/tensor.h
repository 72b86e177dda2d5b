// Tensor: a dtype, a shape and contiguous row-major bytes on one device.
//
// Storage is shared: copying a Tensor or taking a view (Slice, Reshape) never copies bytes, and the
// memory goes back to its allocator when the last Tensor using it is gone. A Tensor is always
// contiguous; there are no strides. That keeps every kernel a plain loop over explicit sizes (the
// kernels in kernels/cpu/ take raw pointers) and makes a view exactly what a collective or a
// checkpoint writer can send as one buffer. Slicing a dimension other than the leading one would
// need strides, so it is a copy (SliceCopy) and its inverse is CopyIntoSlice.
//
// Thread-safety: const methods may be called from any thread; writing the bytes from several
// threads is the caller's business, as with any buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/allocator.h"
#include "kernels/device.h"
#include "kernels/dtype.h"
#include "kernels/half.h"

namespace shardline::kernels {

// The DType a C++ element type stands for: DTypeOf<float> == DType::kFloat32.
template <typename T> struct DTypeOfImpl;
template <> struct DTypeOfImpl<float> { static constexpr DType value = DType::kFloat32; };
template <> struct DTypeOfImpl<double> { static constexpr DType value = DType::kFloat64; };
template <> struct DTypeOfImpl<BFloat16> { static constexpr DType value = DType::kBFloat16; };
template <> struct DTypeOfImpl<Float16> { static constexpr DType value = DType::kFloat16; };
template <> struct DTypeOfImpl<int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct DTypeOfImpl<int64_t> { static constexpr DType value = DType::kInt64; };
template <typename T> inline constexpr DType DTypeOf = DTypeOfImpl<std::remove_const_t<T>>::value;

// "[2,3,4]"
std::string ShapeToString(std::span<const int64_t> shape);

// One block of device memory. Owned blocks go back to `allocator` on destruction; a borrowed
// block (allocator == nullptr) belongs to someone else who keeps it alive.
struct Storage {
  Storage(void* data, size_t nbytes, Allocator* allocator, Device device)
      : data(data), nbytes(nbytes), allocator(allocator), device(device) {}
  ~Storage() {
    if (allocator != nullptr) allocator->Deallocate(data, nbytes);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* const data;
  const size_t nbytes;
  Allocator* const allocator;
  const Device device;
};

class Tensor {
 public:
  // An undefined tensor (defined() is false): no storage, no shape.
  Tensor() = default;

  // Uninitialised bytes from `allocator`. Every dimension must be >= 0 (InvalidArgument otherwise).
  static absl::StatusOr<Tensor> Empty(std::vector<int64_t> shape, DType dtype, Allocator& allocator);
  static absl::StatusOr<Tensor> Zeros(std::vector<int64_t> shape, DType dtype, Allocator& allocator);
  // Wraps memory the caller owns and keeps alive for as long as the tensor (and its views) live.
  static absl::StatusOr<Tensor> FromBlob(void* data, std::vector<int64_t> shape, DType dtype,
                                         Device device);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::kCpu; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  // Size of dimension `d`; negative counts from the end. Precondition: -dim() <= d < dim().
  int64_t size(int64_t d) const { return shape_[d < 0 ? d + dim() : d]; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * DTypeSize(dtype_); }
  // "[2,3] f32 cpu"
  std::string DebugString() const;

  // The first element. Precondition: DTypeOf<T> == dtype() (a programming error otherwise; checked
  // by assert in debug builds). On a CUDA tensor this is a device pointer.
  template <typename T> T* data() {
    CheckType<T>();
    return static_cast<T*>(raw_data());
  }
  template <typename T> const T* data() const {
    CheckType<T>();
    return static_cast<const T*>(raw_data());
  }
  void* raw_data() { return storage_ ? static_cast<char*>(storage_->data) + offset_ : nullptr; }
  const void* raw_data() const {
    return storage_ ? static_cast<const char*>(storage_->data) + offset_ : nullptr;
  }

  // True when both tensors view the same block of memory (possibly different parts of it).
  bool SharesStorageWith(const Tensor& other) const {
    return storage_ != nullptr && storage_ == other.storage_;
  }

  // A view of [start, start + length) along `dim`, sharing memory. Only slices that stay
  // contiguous are views: `dim` is 0, or every dimension before `dim` has size 1. Otherwise
  // InvalidArgument pointing at SliceCopy. Bad dim/range: InvalidArgument naming the shape.
  absl::StatusOr<Tensor> Slice(int64_t dim, int64_t start, int64_t length) const;
  // The same slice along any dimension, copied into a new tensor from `allocator` (CPU only).
  absl::StatusOr<Tensor> SliceCopy(int64_t dim, int64_t start, int64_t length,
                                   Allocator& allocator) const;
  // Writes `src` into [start, start + src.size(dim)) along `dim` of this tensor: the inverse of
  // SliceCopy, e.g. to assemble column shards after an all-gather. Every other dimension and the
  // dtype must match (CPU only).
  absl::Status CopyIntoSlice(int64_t dim, int64_t start, const Tensor& src);
  // A view with another shape of the same numel.
  absl::StatusOr<Tensor> Reshape(std::vector<int64_t> shape) const;
  // A copy converted to `dtype` (CPU only). Supported: any dtype to itself, and f32 <-> bf16,
  // f32 <-> f16 (narrowing rounds to nearest even). Unimplemented for other pairs.
  absl::StatusOr<Tensor> CastCopy(DType dtype, Allocator& allocator) const;

 private:
  Tensor(std::shared_ptr<Storage> storage, size_t offset, std::vector<int64_t> shape, DType dtype);

  template <typename T> void CheckType() const {
#ifndef NDEBUG
    if (DTypeOf<T> != dtype_) BadType(DTypeOf<T>);
#endif
  }
  [[noreturn]] void BadType(DType wanted) const;

  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes from storage_->data to the first element
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::kFloat32;
};

// InvalidArgument "<what>: shape [a,b] f32, expected [c,d] f32" unless `tensor` has exactly this
// shape and dtype. The check the layers above run before calling a kernel that trusts its sizes.
absl::Status ExpectShape(const Tensor& tensor, std::span<const int64_t> shape, DType dtype,
                         std::string_view what);
inline absl::Status ExpectShape(const Tensor& tensor, std::initializer_list<int64_t> shape,
                                DType dtype, std::string_view what) {
  return ExpectShape(tensor, std::span<const int64_t>(shape.begin(), shape.size()), dtype, what);
}

}  // namespace shardline::kernels
