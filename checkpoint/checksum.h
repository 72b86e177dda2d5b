// Checksums of checkpoint bytes: XXH3-64 (xxHash, Debian's libxxhash), which hashes at memory
// speed, so verifying what a load reads costs little beside reading it. In manifests a checksum is
// written as 16 lowercase hex digits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace shardline::checkpoint {

// A running XXH3-64 over bytes given in pieces; the digest equals Xxh3Of of their concatenation.
// Not thread-safe.
class Xxh3 {
 public:
  Xxh3();
  ~Xxh3();
  Xxh3(Xxh3&&) noexcept;
  Xxh3& operator=(Xxh3&&) noexcept;

  void Update(std::span<const std::byte> data);
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

uint64_t Xxh3Of(std::span<const std::byte> data);

std::string ChecksumHex(uint64_t checksum);
// nullopt unless exactly 16 hex digits.
std::optional<uint64_t> ParseChecksumHex(std::string_view text);

struct FileDigest {
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
};
// Reads the whole file at `path` once. NotFound when it does not exist; errors name the path.
absl::StatusOr<FileDigest> DigestFile(const std::string& path);

}  // namespace shardline::checkpoint
