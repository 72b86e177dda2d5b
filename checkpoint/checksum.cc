#include "checkpoint/checksum.h"

#include <xxhash.h>

#include <charconv>
#include <cstdio>


namespace shardline::checkpoint {

struct Xxh3::State {
  XXH3_state_t* state = XXH3_createState();
  ~State() { XXH3_freeState(state); }
};

Xxh3::Xxh3() : state_(std::make_unique<State>()) { XXH3_64bits_reset(state_->state); }
Xxh3::~Xxh3() = default;
Xxh3::Xxh3(Xxh3&&) noexcept = default;
Xxh3& Xxh3::operator=(Xxh3&&) noexcept = default;

void Xxh3::Update(std::span<const std::byte> data) {
  XXH3_64bits_update(state_->state, data.data(), data.size());
}

uint64_t Xxh3::Digest() const { return XXH3_64bits_digest(state_->state); }

uint64_t Xxh3Of(std::span<const std::byte> data) { return XXH3_64bits(data.data(), data.size()); }

std::string ChecksumHex(uint64_t checksum) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(checksum));
  return text;
}

std::optional<uint64_t> ParseChecksumHex(std::string_view text) {
  if (text.size() != 16) return std::nullopt;
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

uint64_t FileChecksum(std::span<const std::byte> header_region,
                      std::span<const uint64_t> tensor_checksums) {
  Xxh3 hash;
  hash.Update(header_region);
  for (const uint64_t checksum : tensor_checksums) {
    std::byte bytes[8];
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<std::byte>(checksum >> (8 * i));
    hash.Update(bytes);
  }
  return hash.Digest();
}

}  // namespace shardline::checkpoint
