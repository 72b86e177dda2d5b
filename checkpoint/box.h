// Boxes of global tensors: the geometry shared by the checkpoint writers (a rank's part of a tensor,
// cut into boxes) and readers (any box put together from the stored boxes that overlap it).
// A box is [offsets, offsets + shape) of a row-major tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "checkpoint/tensor_data.h"

namespace shardline::checkpoint {

struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;

  bool operator==(const Box&) const = default;
};

// OK when the box [offsets, offsets + shape) has the rank of `global_shape` and lies inside it;
// otherwise InvalidArgument prefixed by `where`, with the numbers.
absl::Status CheckBox(std::span<const int64_t> global_shape, std::span<const int64_t> offsets,
                      std::span<const int64_t> shape, const std::string& where);

// Copies into `out` (the box `box_offsets`/`box_shape` of a global tensor, f32, row-major) the
// elements that it shares with `piece`: the box `piece_offsets`/`piece_shape` of the same tensor,
// stored at `data` as `dtype`, row-major. Elements of `out` outside the piece are left alone. Any
// rank, including 0 (a scalar). False, copying nothing, when `dtype` is not F32/F64/F16/BF16.
bool CopyBoxOverlap(SafetensorsDType dtype, const std::byte* data,
                    std::span<const int64_t> piece_offsets, std::span<const int64_t> piece_shape,
                    std::span<const int64_t> box_offsets, std::span<const int64_t> box_shape,
                    float* out);

// The boxes, in row-major order, whose elements are exactly the elements [begin, end) of a tensor of
// shape `shape` in row-major order: each box's elements are one contiguous run of that order, and
// the runs follow one another, so the data of [begin, end) is the boxes' data back to back. Boxes
// are relative to the tensor (offsets from its origin). At most 2·rank − 1 boxes; none when the
// range is empty. Used where a rank owns a flat range of a tensor (ZeRO's partition of a layer),
// which is not in general a box. Expects 0 <= begin <= end <= the element count.
std::vector<Box> SplitFlatRange(std::span<const int64_t> shape, int64_t begin, int64_t end);

}  // namespace shardline::checkpoint
