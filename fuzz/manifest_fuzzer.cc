// The checkpoint manifest parser (checkpoint/manifest.h) on arbitrary text: ParseManifest must
// refuse what is malformed or inconsistent with InvalidArgument, and a manifest it accepts must
// survive its own writer: ManifestToJson then ParseManifest gives it back unchanged (a step that
// was committed must load again).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "checkpoint/manifest.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using shardline::checkpoint::Manifest;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<Manifest> manifest = shardline::checkpoint::ParseManifest(text, "fuzz.json");
  if (!manifest.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(manifest.status()),
               "not InvalidArgument: " + manifest.status().ToString());
    return 0;
  }
  (void)shardline::checkpoint::HasOptimizerState(*manifest);
  const std::string written = shardline::checkpoint::ManifestToJson(*manifest);
  absl::StatusOr<Manifest> again = shardline::checkpoint::ParseManifest(written, "rewritten.json");
  FUZZ_CHECK(again.ok(), "the rewritten manifest does not parse: " + again.status().ToString() +
                             "\n" + written);
  FUZZ_CHECK(*again == *manifest, "the rewritten manifest differs:\n" + written);
  return 0;
}
