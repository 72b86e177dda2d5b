// Checksums of checkpoint bytes: XXH3-64 (xxHash, Debian's libxxhash), which hashes at memory
// speed (15 GB/s on one core here), so verifying what a load reads costs little beside reading
// it. In manifests a checksum is written as 16 lowercase hex digits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>


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

// The checksum of a whole safetensors file: XXH3-64 of its header region (the 8-byte length and
// the JSON header) followed by the 8-byte little-endian XXH3-64 of each tensor's bytes, in file
// order. It covers every byte of a file without holes (ours have none) while hashing each byte
// once: the writer hashes each tensor for its own checksum anyway, and so does a verifier.
uint64_t FileChecksum(std::span<const std::byte> header_region,
                      std::span<const uint64_t> tensor_checksums);

}  // namespace shardline::checkpoint
