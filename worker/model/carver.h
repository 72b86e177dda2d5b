// Carving many buffers out of one allocation, so that the allocator's accounting shows a group of
// activations as one number: run a carve function once with a null base to count the floats,
// allocate that many, then run it again on the allocation.
#pragma once

#include <cstdint>

namespace shardline::model {

// Hands out consecutive ranges of a buffer; with base == nullptr it only counts.
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* Take(int64_t n) {
    float* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += n;
    return p;
  }
  int64_t used() const { return used_; }

 private:
  float* base_;
  int64_t used_ = 0;
};

}  // namespace shardline::model
