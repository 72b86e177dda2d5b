// Byte sizes as people write them in specs ("64MiB", "4KiB", "1GB", "4096") and as we print them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace shardline::placement {

// Parses a non-negative byte count: a plain integer, or an integer followed (optionally after one
// space) by a unit. Binary units KiB/MiB/GiB/TiB are powers of 1024, decimal units KB/MB/GB/TB are
// powers of 1000, and "B" is bytes. Units are case-sensitive because "mb" (millibits) and "Mb"
// (megabits) mean other things and a silent guess would be off by 8x or 1000x.
// Returns InvalidArgument with a message meant to follow "PATH: " (no location of its own).
absl::StatusOr<int64_t> ParseByteSize(std::string_view text);

// Formats `bytes` in the largest binary unit that divides it exactly ("64MiB", "12KiB"), else as
// "1000B", so ParseByteSize(FormatByteSize(n)) == n for every n >= 0.
std::string FormatByteSize(int64_t bytes);

// A measured or predicted size as people read it, rounded: "72.1 GiB", "3.4 MiB", "880.0 KiB",
// "512 B" (one decimal from KiB up, in the largest binary unit not above it).
std::string FormatApproxByteSize(double bytes);

}  // namespace shardline::placement
