// The safetensors reader (checkpoint/safetensors_reader.h) on arbitrary files: Open must refuse a
// malformed file with InvalidArgument, and every tensor of a file it accepts must lie inside the
// mapping (ASan sees each byte read) and convert to fp32 when its dtype is a float.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "checkpoint/safetensors_reader.h"
#include "fuzz/fuzz_support.h"

namespace {

using shardline::checkpoint::SafetensorsDType;
using shardline::checkpoint::SafetensorsReader;

bool IsFloat(SafetensorsDType dtype) {
  return dtype == SafetensorsDType::kF32 || dtype == SafetensorsDType::kF64 ||
         dtype == SafetensorsDType::kF16 || dtype == SafetensorsDType::kBF16;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const shardline::fuzz::MemoryFile file(
      std::string_view(reinterpret_cast<const char*>(data), size));
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(file.path());
  if (!reader.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(reader.status()),
               "not InvalidArgument: " + reader.status().ToString());
    return 0;
  }
  uint8_t checksum = 0;
  for (const std::byte b : reader->HeaderRegion()) checksum ^= static_cast<uint8_t>(b);
  for (const auto& [name, info] : reader->tensors()) {
    for (const std::byte b : reader->Data(info)) checksum ^= static_cast<uint8_t>(b);
    if (!IsFloat(info.dtype)) continue;
    absl::StatusOr<shardline::checkpoint::HostTensor> tensor = reader->ReadFloat(name);
    FUZZ_CHECK(tensor.ok(), "a float tensor did not convert: " + tensor.status().ToString());
    FUZZ_CHECK(tensor->shape == info.shape, "ReadFloat changed the shape of " + name);
  }
  // Keeps the reads above from being optimised away.
  volatile uint8_t sink = checksum;
  (void)sink;
  return 0;
}
