// The memory step a resuming rank is told of (Assignment.memoryResume, checkpoint/memory_step.h)
// on arbitrary text: ParseMemoryResume must refuse what is malformed with InvalidArgument, and
// what it accepts names every file of its manifest once with a rank of the world, and survives
// its own writer unchanged.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "checkpoint/memory_step.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using shardline::checkpoint::MemoryResume;
  constexpr int64_t kWorld = 4;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<MemoryResume> resume =
      shardline::checkpoint::ParseMemoryResume(text, kWorld, "fuzz.json");
  if (!resume.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(resume.status()),
               "not InvalidArgument: " + resume.status().ToString());
    return 0;
  }
  std::set<std::string> named;
  for (const MemoryResume::Source& source : resume->sources) {
    FUZZ_CHECK(source.rank >= 0 && source.rank < kWorld, "a source rank outside the world");
    FUZZ_CHECK(resume->manifest.files.contains(source.file), "a source outside the manifest");
    FUZZ_CHECK(named.insert(source.file).second, "a file with two sources");
  }
  FUZZ_CHECK(named.size() == resume->manifest.files.size(), "a file without a source");
  const std::string written = shardline::checkpoint::MemoryResumeToJson(*resume);
  absl::StatusOr<MemoryResume> again =
      shardline::checkpoint::ParseMemoryResume(written, kWorld, "rewritten.json");
  FUZZ_CHECK(again.ok(), "the rewritten memory step does not parse: " + again.status().ToString());
  FUZZ_CHECK(again->manifest == resume->manifest && again->generation == resume->generation &&
                 again->kind == resume->kind && again->sources.size() == resume->sources.size(),
             "the rewritten memory step differs:\n" + written);
  return 0;
}
