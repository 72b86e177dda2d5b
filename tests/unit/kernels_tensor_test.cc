// Tensor views and copies, the CPU allocator's accounting, and the 16-bit float conversions.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/allocator.h"
#include "kernels/half.h"
#include "kernels/tensor.h"

namespace shardline::kernels {
namespace {

TEST(CpuAllocatorTest, AccountsBytesInUseAndPeak) {
  CpuAllocator allocator;
  void* a = allocator.Allocate(1000).value();
  void* b = allocator.Allocate(24).value();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % CpuAllocator::kAlignment, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % CpuAllocator::kAlignment, 0u);
  EXPECT_EQ(allocator.stats().bytes_in_use, 1024u);
  EXPECT_EQ(allocator.stats().peak_bytes, 1024u);
  allocator.Deallocate(a, 1000);
  EXPECT_EQ(allocator.stats().bytes_in_use, 24u);
  EXPECT_EQ(allocator.stats().peak_bytes, 1024u);
  allocator.ResetPeak();
  EXPECT_EQ(allocator.stats().peak_bytes, 24u);
  void* c = allocator.Allocate(100).value();
  EXPECT_EQ(allocator.stats().peak_bytes, 124u);
  allocator.Deallocate(b, 24);
  allocator.Deallocate(c, 100);
  allocator.Deallocate(nullptr, 0);
  EXPECT_EQ(allocator.stats().bytes_in_use, 0u);
  EXPECT_EQ(allocator.stats().allocations, 3u);
}

TEST(CpuAllocatorTest, ZeroBytesGivesDistinctPointers) {
  CpuAllocator allocator;
  void* a = allocator.Allocate(0).value();
  void* b = allocator.Allocate(0).value();
  EXPECT_NE(a, nullptr);
  EXPECT_NE(a, b);
  allocator.Deallocate(a, 0);
  allocator.Deallocate(b, 0);
}

TEST(CpuAllocatorTest, HugeRequestIsResourceExhausted) {
  CpuAllocator allocator;
  auto result = allocator.Allocate(std::numeric_limits<size_t>::max() / 2);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(allocator.stats().bytes_in_use, 0u);
}

TEST(CpuAllocatorTest, AccountingIsThreadSafe) {
  CpuAllocator allocator;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&allocator] {
      for (int i = 0; i < 2000; ++i) {
        void* p = allocator.Allocate(128).value();
        allocator.Deallocate(p, 128);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(allocator.stats().bytes_in_use, 0u);
  EXPECT_LE(allocator.stats().peak_bytes, 4u * 128u);
  EXPECT_GE(allocator.stats().peak_bytes, 128u);
  EXPECT_EQ(allocator.stats().allocations, 8000u);
}

TEST(TensorTest, MemoryReturnsToAllocatorWhenLastViewDies) {
  CpuAllocator allocator;
  {
    Tensor t = Tensor::Zeros({4, 8}, DType::kFloat32, allocator).value();
    EXPECT_EQ(t.numel(), 32);
    EXPECT_EQ(t.nbytes(), 128u);
    EXPECT_EQ(allocator.stats().bytes_in_use, 128u);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(t.data<float>()[i], 0.0f);
    Tensor view = t.Slice(0, 1, 2).value();
    t = Tensor();
    EXPECT_EQ(allocator.stats().bytes_in_use, 128u) << "the view keeps the storage alive";
    EXPECT_EQ(view.shape(), (std::vector<int64_t>{2, 8}));
  }
  EXPECT_EQ(allocator.stats().bytes_in_use, 0u);
  EXPECT_EQ(allocator.stats().peak_bytes, 128u);
}

TEST(TensorTest, SliceSharesMemory) {
  CpuAllocator allocator;
  Tensor t = Tensor::Empty({6, 3}, DType::kFloat32, allocator).value();
  for (int i = 0; i < 18; ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor rows = t.Slice(0, 2, 3).value();
  EXPECT_TRUE(rows.SharesStorageWith(t));
  EXPECT_EQ(rows.shape(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(rows.data<float>(), t.data<float>() + 6);
  rows.data<float>()[0] = -1.0f;
  EXPECT_EQ(t.data<float>()[6], -1.0f);
  // A slice of a slice lands at the sum of the offsets.
  Tensor row = rows.Slice(0, 1, 1).value();
  EXPECT_EQ(row.data<float>(), t.data<float>() + 9);
  // Leading dimensions of size 1 keep a later dimension's slice contiguous.
  Tensor one = row.Slice(1, 1, 2).value();
  EXPECT_EQ(one.data<float>(), t.data<float>() + 10);
  EXPECT_EQ(one.shape(), (std::vector<int64_t>{1, 2}));
}

TEST(TensorTest, SliceRejectsNonContiguousAndOutOfRange) {
  CpuAllocator allocator;
  Tensor t = Tensor::Empty({4, 6}, DType::kFloat32, allocator).value();
  auto strided = t.Slice(1, 0, 3);
  EXPECT_EQ(strided.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(strided.status().message().find("SliceCopy"), absl::string_view::npos);
  EXPECT_EQ(t.Slice(0, 3, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Slice(2, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Slice(0, -1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  auto bad = t.Slice(0, 3, 2);
  EXPECT_NE(bad.status().message().find("[4,6]"), absl::string_view::npos) << bad.status();
}

TEST(TensorTest, SliceCopyAndCopyIntoSliceAreInverse) {
  CpuAllocator allocator;
  Tensor t = Tensor::Empty({2, 3, 4}, DType::kFloat32, allocator).value();
  for (int i = 0; i < 24; ++i) t.data<float>()[i] = static_cast<float>(i);
  // Column shards along dim 2 (what a column-parallel linear's output gather reassembles).
  Tensor left = t.SliceCopy(2, 0, 1, allocator).value();
  Tensor right = t.SliceCopy(2, 1, 3, allocator).value();
  EXPECT_FALSE(left.SharesStorageWith(t));
  EXPECT_EQ(right.shape(), (std::vector<int64_t>{2, 3, 3}));
  for (int b = 0; b < 2; ++b) {
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(left.data<float>()[b * 3 + r], t.data<float>()[b * 12 + r * 4]);
      for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(right.data<float>()[(b * 3 + r) * 3 + c], t.data<float>()[b * 12 + r * 4 + 1 + c]);
      }
    }
  }
  Tensor rebuilt = Tensor::Zeros({2, 3, 4}, DType::kFloat32, allocator).value();
  ASSERT_TRUE(rebuilt.CopyIntoSlice(2, 0, left).ok());
  ASSERT_TRUE(rebuilt.CopyIntoSlice(2, 1, right).ok());
  EXPECT_EQ(std::memcmp(rebuilt.raw_data(), t.raw_data(), t.nbytes()), 0);
  // Wrong placement or shape is an error, not a partial write.
  EXPECT_EQ(rebuilt.CopyIntoSlice(2, 2, right).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rebuilt.CopyIntoSlice(1, 0, right).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorTest, ReshapeIsAViewWithTheSameElementCount) {
  CpuAllocator allocator;
  Tensor t = Tensor::Empty({2, 3, 4}, DType::kFloat32, allocator).value();
  Tensor flat = t.Reshape({6, 4}).value();
  EXPECT_TRUE(flat.SharesStorageWith(t));
  EXPECT_EQ(flat.data<float>(), t.data<float>());
  EXPECT_EQ(t.Reshape({5, 5}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tensor::Empty({2, -1}, DType::kFloat32, allocator).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TensorTest, FromBlobBorrowsMemory) {
  std::vector<int32_t> tokens = {1, 2, 3, 4};
  Tensor t = Tensor::FromBlob(tokens.data(), {2, 2}, DType::kInt32, Device::kCpu).value();
  EXPECT_EQ(t.data<int32_t>(), tokens.data());
  EXPECT_EQ(t.Slice(0, 1, 1).value().data<int32_t>()[1], 4);
}

TEST(TensorTest, ExpectShapeNamesBothShapes) {
  CpuAllocator allocator;
  Tensor t = Tensor::Empty({2, 3}, DType::kFloat32, allocator).value();
  EXPECT_TRUE(ExpectShape(t, {2, 3}, DType::kFloat32, "x").ok());
  absl::Status s = ExpectShape(t, {3, 2}, DType::kFloat32, "matmul inp");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(s.message()), "matmul inp: shape [2,3] f32, expected [3,2] f32");
  EXPECT_FALSE(ExpectShape(t, {2, 3}, DType::kBFloat16, "x").ok());
  EXPECT_FALSE(ExpectShape(Tensor(), {2, 3}, DType::kFloat32, "x").ok());
}

TEST(HalfTest, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly half-way between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);
  // 1 + 3·2^-8 is half-way between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)).bits, 0x3f81);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()).bits, 0x7f80);  // overflows
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const BFloat16 h{static_cast<uint16_t>(bits)};
    const float f = BFloat16ToFloat(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBFloat16(f).bits, bits) << "round trip of " << f;
  }
}

TEST(HalfTest, Float16MatchesIeeeBinary16) {
  EXPECT_EQ(FloatToFloat16(1.0f).bits, 0x3c00);
  EXPECT_EQ(FloatToFloat16(-2.0f).bits, 0xc000);
  EXPECT_EQ(FloatToFloat16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(FloatToFloat16(65519.0f).bits, 0x7bff);
  EXPECT_EQ(FloatToFloat16(65520.0f).bits, 0x7c00);  // the tie rounds to even: infinity
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -24)).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -25)).bits, 0x0000);  // tie with zero: to even
  EXPECT_EQ(FloatToFloat16(std::ldexp(3.0f, -26)).bits, 0x0001);
  EXPECT_EQ(FloatToFloat16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);      // tie to even
  EXPECT_EQ(FloatToFloat16(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);  // tie to even
  EXPECT_EQ(FloatToFloat16(-std::numeric_limits<float>::infinity()).bits, 0xfc00);
  EXPECT_EQ(FloatToFloat16(std::nanf("")).bits & 0x7e00, 0x7e00);
  EXPECT_EQ(Float16ToFloat(Float16{0x0001}), std::ldexp(1.0f, -24));
  EXPECT_EQ(Float16ToFloat(Float16{0x8000}), -0.0f);
  EXPECT_TRUE(std::signbit(Float16ToFloat(Float16{0x8000})));
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const Float16 h{static_cast<uint16_t>(bits)};
    const float f = Float16ToFloat(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToFloat16(f).bits, bits) << "round trip of " << f;
  }
}

TEST(TensorTest, CastCopyConvertsThroughTheHalfTypes) {
  CpuAllocator allocator;
  Tensor t = Tensor::Empty({3}, DType::kFloat32, allocator).value();
  t.data<float>()[0] = 1.0f;
  t.data<float>()[1] = -3.140625f;
  t.data<float>()[2] = 1.0f + std::ldexp(1.0f, -9);
  Tensor bf = t.CastCopy(DType::kBFloat16, allocator).value();
  EXPECT_EQ(bf.nbytes(), 6u);
  Tensor back = bf.CastCopy(DType::kFloat32, allocator).value();
  EXPECT_EQ(back.data<float>()[0], 1.0f);
  EXPECT_EQ(back.data<float>()[1], -3.140625f);
  EXPECT_EQ(back.data<float>()[2], 1.0f);  // rounded away: bf16 keeps 8 mantissa bits
  Tensor h = t.CastCopy(DType::kFloat16, allocator).value();
  EXPECT_EQ(h.CastCopy(DType::kFloat32, allocator).value().data<float>()[2],
            1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(bf.CastCopy(DType::kFloat16, allocator).status().code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace shardline::kernels
