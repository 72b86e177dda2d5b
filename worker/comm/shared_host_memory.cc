#include "worker/comm/shared_host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace shardline::comm {
namespace {

constexpr size_t kPage = 4096;

struct Block {
  size_t bytes;  // mapped, page-rounded
  int fd;
  uint64_t id;
};

// Every live block of the process by start address, for FindSharedBlock: a communicator is
// handed a raw pointer and must tell whether its peers can map it.
std::mutex& BlocksMutex() {
  static std::mutex mu;
  return mu;
}
std::map<uintptr_t, Block>& Blocks() {
  static auto* blocks = new std::map<uintptr_t, Block>();
  return *blocks;
}
uint64_t next_id = 1;  // guarded by BlocksMutex()

}  // namespace

absl::StatusOr<void*> SharedHostAllocator::Allocate(size_t nbytes) {
  const size_t rounded = nbytes == 0 ? kPage : (nbytes + kPage - 1) / kPage * kPage;
  if (rounded < nbytes) {
    return absl::ResourceExhaustedError("shared host allocation of " + std::to_string(nbytes) +
                                        " bytes overflows size_t");
  }
  const auto failed = [&](const char* step) {
    return absl::ResourceExhaustedError("shared host allocation of " + std::to_string(nbytes) +
                                        " bytes: " + step + ": " + std::strerror(errno));
  };
  const int fd = memfd_create("shardline-comm-buffer", MFD_CLOEXEC);
  if (fd < 0) return failed("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(rounded)) != 0) {
    const absl::Status status = failed("ftruncate");
    close(fd);
    return status;
  }
  void* base = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const absl::Status status = failed("mmap");
    close(fd);
    return status;
  }
  {
    std::lock_guard<std::mutex> lock(BlocksMutex());
    Blocks()[reinterpret_cast<uintptr_t>(base)] = Block{rounded, fd, next_id++};
  }
  counter_.Allocated(nbytes);
  return base;
}

void SharedHostAllocator::Deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  Block block{};
  {
    std::lock_guard<std::mutex> lock(BlocksMutex());
    auto found = Blocks().find(reinterpret_cast<uintptr_t>(ptr));
    if (found == Blocks().end()) return;  // not ours: Allocate never handed it out
    block = found->second;
    Blocks().erase(found);
  }
  munmap(ptr, block.bytes);
  close(block.fd);
  counter_.Freed(nbytes);
}

absl::Status SharedHostAllocator::FillZero(void* ptr, size_t nbytes) {
  std::memset(ptr, 0, nbytes);
  return absl::OkStatus();
}

std::optional<SharedBlockRef> FindSharedBlock(const void* data, size_t bytes) {
  const auto at = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(BlocksMutex());
  auto& blocks = Blocks();
  auto after = blocks.upper_bound(at);
  if (after == blocks.begin()) return std::nullopt;
  const auto& [base, block] = *std::prev(after);
  const size_t offset = at - base;
  if (offset > block.bytes || bytes > block.bytes - offset) return std::nullopt;
  return SharedBlockRef{block.fd, block.id, block.bytes, offset};
}

}  // namespace shardline::comm
