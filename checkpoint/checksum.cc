#include "checkpoint/checksum.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

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

absl::StatusOr<FileDigest> DigestFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string message = absl::StrCat(path, ": cannot open: ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(message) : absl::InternalError(message);
  }
  // Sequential reads in large blocks: the kernel reads ahead, and the hash keeps up with it.
  std::vector<std::byte> buffer(size_t{4} << 20);
  Xxh3 hash;
  FileDigest digest;
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string message = absl::StrCat(path, ": read: ", std::strerror(errno));
      ::close(fd);
      return absl::InternalError(message);
    }
    if (n == 0) break;
    hash.Update(std::span<const std::byte>(buffer.data(), static_cast<size_t>(n)));
    digest.bytes += static_cast<uint64_t>(n);
  }
  ::close(fd);
  digest.xxh3 = hash.Digest();
  return digest;
}

}  // namespace shardline::checkpoint
