// Damage a test does to a checkpoint file on purpose: one byte of it changed in place, as a disk
// or a copy might.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace shardline::testing {

// XORs the byte at `offset` of the file at `path` with `bits`; a negative offset counts from the
// end (-1: the last byte).
inline void FlipBits(const std::string& path, int64_t offset, unsigned char bits = 0x01) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  const auto origin = offset < 0 ? std::ios::end : std::ios::beg;
  file.seekg(static_cast<std::streamoff>(offset), origin);
  char byte = 0;
  file.read(&byte, 1);
  byte = static_cast<char>(byte ^ bits);
  file.seekp(static_cast<std::streamoff>(offset), origin);
  file.write(&byte, 1);
}

}  // namespace shardline::testing
