#include "placement/byte_size.h"

#include <array>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "placement/string_view_compat.h"

namespace shardline::placement {
namespace {

struct Unit {
  std::string_view suffix;
  int64_t multiplier;
};

// Longest suffixes first so that "KiB" is not read as "B" after a bad number "64Ki".
constexpr std::array<Unit, 9> kUnits = {{
    {"KiB", int64_t{1} << 10},
    {"MiB", int64_t{1} << 20},
    {"GiB", int64_t{1} << 30},
    {"TiB", int64_t{1} << 40},
    {"KB", 1'000},
    {"MB", 1'000'000},
    {"GB", 1'000'000'000},
    {"TB", 1'000'000'000'000},
    {"B", 1},
}};

constexpr std::string_view kExpected =
    "expected a byte size such as 4096, 64KiB, 16MiB or 1GB (units B, KB, MB, GB, TB, KiB, MiB, "
    "GiB, TiB)";

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(std::string_view text) {
  const std::string original(text);
  std::string_view number = text;
  int64_t multiplier = 1;
  for (const Unit& unit : kUnits) {
    if (number.size() > unit.suffix.size() && number.ends_with(unit.suffix)) {
      number.remove_suffix(unit.suffix.size());
      if (number.ends_with(' ')) number.remove_suffix(1);
      multiplier = unit.multiplier;
      break;
    }
  }
  // Only digits: absl::SimpleAtoi would also take "+4", " 4" and "-4", none of which is a size.
  if (number.empty() || number.find_first_not_of("0123456789") != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(AbslView(kExpected), ", got '", original, "'"));
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(absl::string_view(number.data(), number.size()), &value) ||
      value > std::numeric_limits<int64_t>::max() / multiplier) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte size '", original, "' is too large (at most 2^63-1 bytes)"));
  }
  return value * multiplier;
}

std::string FormatByteSize(int64_t bytes) {
  static constexpr std::array<std::pair<std::string_view, int>, 4> kBinary = {{
      {"TiB", 40},
      {"GiB", 30},
      {"MiB", 20},
      {"KiB", 10},
  }};
  if (bytes > 0) {
    for (const auto& [suffix, shift] : kBinary) {
      const int64_t unit = int64_t{1} << shift;
      if (bytes % unit == 0) return absl::StrCat(bytes / unit, AbslView(suffix));
    }
  }
  return absl::StrCat(bytes, "B");
}

std::string FormatApproxByteSize(double bytes) {
  static constexpr std::array<std::string_view, 5> kUnits = {"B", "KiB", "MiB", "GiB", "TiB"};
  size_t unit = 0;
  while (unit + 1 < kUnits.size() && std::abs(bytes) >= 1024.0) {
    bytes /= 1024.0;
    ++unit;
  }
  // Two calls: clang checks a format at compile time and refuses one chosen at run time.
  return unit == 0 ? absl::StrFormat("%.0f %s", bytes, AbslView(kUnits[unit]))
                   : absl::StrFormat("%.1f %s", bytes, AbslView(kUnits[unit]));
}

}  // namespace shardline::placement
