// SharedHostAllocator: zeroed blocks a peer can map, found again from any pointer inside them,
// and nothing left (descriptor, mapping, registry entry) once freed. Peers mapping them in an
// all-reduce: comm_shm_test's ShmSingleCopyTest.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "worker/comm/shared_host_memory.h"

namespace shardline::comm {
namespace {

int OpenDescriptors() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++n;
  }
  return n;
}

TEST(SharedHostAllocatorTest, BlocksAreZeroedCountedAndFoundFromInsidePointers) {
  SharedHostAllocator allocator;
  constexpr size_t kBytes = 3 * 4096 + 100;
  auto block = allocator.Allocate(kBytes);
  ASSERT_TRUE(block.ok()) << block.status();
  char* base = static_cast<char*>(*block);
  for (size_t i = 0; i < kBytes; ++i) ASSERT_EQ(base[i], 0) << "byte " << i;
  EXPECT_EQ(allocator.stats().bytes_in_use, kBytes);
  EXPECT_EQ(allocator.stats().allocations, 1u);

  const auto whole = FindSharedBlock(base, kBytes);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->offset, 0u);
  EXPECT_EQ(whole->block_bytes, 4 * 4096u);  // page-rounded
  const auto inner = FindSharedBlock(base + 5000, 100);
  ASSERT_TRUE(inner.has_value());
  EXPECT_EQ(inner->offset, 5000u);
  EXPECT_EQ(inner->fd, whole->fd);
  EXPECT_EQ(inner->id, whole->id);
  // Past the block's end, or not in any block: not shared.
  EXPECT_FALSE(FindSharedBlock(base + 4 * 4096 - 10, 11).has_value());
  int on_stack = 0;
  EXPECT_FALSE(FindSharedBlock(&on_stack, sizeof(on_stack)).has_value());

  // The descriptor is what a peer opens (/proc/<pid>/fd/N): it maps the same bytes.
  std::strcpy(base + 4096, "written by the owner");
  const int opened =
      open(("/proc/self/fd/" + std::to_string(whole->fd)).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(opened, 0);
  void* peer = mmap(nullptr, whole->block_bytes, PROT_READ, MAP_SHARED, opened, 0);
  close(opened);
  ASSERT_NE(peer, MAP_FAILED);
  EXPECT_STREQ(static_cast<const char*>(peer) + 4096, "written by the owner");
  munmap(peer, whole->block_bytes);

  const auto second = allocator.Allocate(10);
  ASSERT_TRUE(second.ok());
  EXPECT_NE(FindSharedBlock(*second, 10)->id, whole->id);  // ids are never reused
  EXPECT_EQ(allocator.stats().peak_bytes, kBytes + 10);
  allocator.Deallocate(*second, 10);
  allocator.Deallocate(base, kBytes);
}

TEST(SharedHostAllocatorTest, FreeingClosesTheDescriptorAndForgetsTheBlock) {
  SharedHostAllocator allocator;
  const int before = OpenDescriptors();
  auto block = allocator.Allocate(1 << 20);
  ASSERT_TRUE(block.ok());
  EXPECT_EQ(OpenDescriptors(), before + 1);
  allocator.Deallocate(*block, 1 << 20);
  EXPECT_EQ(OpenDescriptors(), before);
  EXPECT_FALSE(FindSharedBlock(*block, 1).has_value());
  EXPECT_EQ(allocator.stats().bytes_in_use, 0u);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    EXPECT_EQ(line.find("shardline-comm-buffer"), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace shardline::comm
