#include "checkpoint/box.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardline::checkpoint {
namespace {

// Row-major strides, in elements.
std::vector<int64_t> Strides(std::span<const int64_t> shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

// SplitFlatRange below dimension `dim`: `prefix` holds the indices of the dimensions before it
// (each box is one slab of them).
void SplitFrom(std::span<const int64_t> shape, size_t dim, std::vector<int64_t>& prefix,
               int64_t begin, int64_t end, std::vector<Box>& out) {
  if (begin >= end) return;
  const size_t rank = shape.size();
  int64_t inner = 1;  // elements per index of `dim`
  for (size_t d = dim + 1; d < rank; ++d) inner *= shape[d];
  const auto emit = [&](int64_t first, int64_t count) {
    Box box;
    box.offsets = prefix;
    box.shape.assign(prefix.size(), 1);
    box.offsets.push_back(first);
    box.shape.push_back(count);
    for (size_t d = dim + 1; d < rank; ++d) {
      box.offsets.push_back(0);
      box.shape.push_back(shape[d]);
    }
    out.push_back(std::move(box));
  };
  int64_t first = begin / inner;
  const int64_t head = begin % inner;
  const int64_t last = end / inner;  // exclusive when tail == 0
  const int64_t tail = end % inner;
  const auto descend = [&](int64_t index, int64_t from, int64_t to) {
    prefix.push_back(index);
    SplitFrom(shape, dim + 1, prefix, from, to, out);
    prefix.pop_back();
  };
  if (first == last) {  // inside one slab of `dim`
    descend(first, head, tail);
    return;
  }
  if (head != 0) {
    descend(first, head, inner);
    ++first;
  }
  if (last > first) emit(first, last - first);
  if (tail != 0) descend(last, 0, tail);
}

}  // namespace

absl::Status CheckBox(std::span<const int64_t> global_shape, std::span<const int64_t> offsets,
                      std::span<const int64_t> shape, const std::string& where) {
  if (offsets.size() != global_shape.size() || shape.size() != global_shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": box at ", ShapeString(offsets), " of shape ", ShapeString(shape),
                     " does not have the rank of the global shape ", ShapeString(global_shape)));
  }
  for (size_t d = 0; d < global_shape.size(); ++d) {
    // Written so that no sum can overflow, whatever a caller passes.
    if (offsets[d] < 0 || shape[d] < 0 || offsets[d] > global_shape[d] ||
        shape[d] > global_shape[d] - offsets[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": box at ", ShapeString(offsets), " of shape ", ShapeString(shape),
                       " leaves the global shape ", ShapeString(global_shape)));
    }
  }
  return absl::OkStatus();
}

bool CopyBoxOverlap(SafetensorsDType dtype, const std::byte* data,
                    std::span<const int64_t> piece_offsets, std::span<const int64_t> piece_shape,
                    std::span<const int64_t> box_offsets, std::span<const int64_t> box_shape,
                    float* out) {
  if (!IsFloatDType(dtype)) return false;
  const size_t rank = piece_shape.size();
  if (rank == 0) return ConvertToFloat(dtype, data, 1, out);
  // The overlap [lo, lo + extent) in global coordinates.
  std::vector<int64_t> lo(rank), extent(rank);
  for (size_t d = 0; d < rank; ++d) {
    lo[d] = std::max(piece_offsets[d], box_offsets[d]);
    const int64_t hi = std::min(piece_offsets[d] + piece_shape[d], box_offsets[d] + box_shape[d]);
    if (hi <= lo[d]) return true;  // nothing shared
    extent[d] = hi - lo[d];
  }
  const std::vector<int64_t> src_strides = Strides(piece_shape);
  const std::vector<int64_t> dst_strides = Strides(box_shape);
  // Trailing dimensions that the overlap spans whole in both the piece and the box are contiguous
  // in both, so each copy takes all of them at once: a row split of (V, C) copies one run.
  size_t inner = rank - 1;
  int64_t run = extent[inner];
  while (inner > 0 && extent[inner] == piece_shape[inner] && extent[inner] == box_shape[inner]) {
    --inner;
    run *= extent[inner];
  }
  const size_t element = DTypeSize(dtype);
  std::vector<int64_t> index(inner, 0);  // over the outer dimensions [0, inner)
  while (true) {
    int64_t src = (lo[inner] - piece_offsets[inner]) * src_strides[inner];
    int64_t dst = (lo[inner] - box_offsets[inner]) * dst_strides[inner];
    for (size_t d = 0; d < inner; ++d) {
      src += (lo[d] + index[d] - piece_offsets[d]) * src_strides[d];
      dst += (lo[d] + index[d] - box_offsets[d]) * dst_strides[d];
    }
    ConvertToFloat(dtype, data + static_cast<size_t>(src) * element, static_cast<size_t>(run),
                   out + dst);
    size_t d = inner;
    while (d > 0 && ++index[d - 1] == extent[d - 1]) index[--d] = 0;
    if (d == 0) break;
  }
  return true;
}

std::vector<Box> SplitFlatRange(std::span<const int64_t> shape, int64_t begin, int64_t end) {
  std::vector<Box> boxes;
  if (begin >= end) return boxes;
  if (shape.empty()) {  // a scalar: its one element
    boxes.push_back(Box{});
    return boxes;
  }
  std::vector<int64_t> prefix;
  SplitFrom(shape, 0, prefix, begin, end, boxes);
  return boxes;
}

}  // namespace shardline::checkpoint
