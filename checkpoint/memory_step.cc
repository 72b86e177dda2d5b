#include "checkpoint/memory_step.h"

#include <set>

#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace shardline::checkpoint {

using Json = nlohmann::json;

absl::StatusOr<std::string> MemoryJobDir(const std::string& store, const std::string& job_id) {
  if (store.empty()) return absl::InvalidArgumentError("no memory store");
  if (job_id.empty() || job_id == "." || job_id == ".." || job_id.find('/') != std::string::npos) {
    return absl::InvalidArgumentError("job id '" + job_id + "' cannot name a memory folder");
  }
  return store + "/" + job_id;
}

absl::StatusOr<std::string> MemoryGenerationDir(const std::string& store, const std::string& job_id,
                                                uint32_t generation) {
  ASSIGN_OR_RETURN(const std::string job, MemoryJobDir(store, job_id));
  return job + "/g" + std::to_string(generation);
}

std::string MemoryResumeToJson(const MemoryResume& resume) {
  Json sources = Json::array();
  for (const MemoryResume::Source& source : resume.sources) {
    sources.push_back({{"file", source.file}, {"rank", source.rank}});
  }
  const Json json = {{"manifest", ManifestToJson(resume.manifest)},
                     {"generation", resume.generation},
                     {"sources", sources},
                     {"kind", resume.kind}};
  return json.dump();
}

absl::StatusOr<MemoryResume> ParseMemoryResume(std::string_view json, int64_t world,
                                               const std::string& source) {
  const auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(source + ": " + what);
  };
  const Json parsed = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) return bad("not a JSON object");
  const auto manifest = parsed.find("manifest");
  const auto generation = parsed.find("generation");
  const auto sources = parsed.find("sources");
  const auto kind = parsed.find("kind");
  if (manifest == parsed.end() || !manifest->is_string()) return bad("no \"manifest\" text");
  if (generation == parsed.end() || !generation->is_number_unsigned() ||
      generation->get<uint64_t>() > UINT32_MAX) {
    return bad("no \"generation\" number");
  }
  if (sources == parsed.end() || !sources->is_array()) return bad("no \"sources\" list");
  MemoryResume resume;
  auto read = ParseManifest(manifest->get<std::string>(), source + " manifest");
  if (!read.ok()) return read.status();
  resume.manifest = *std::move(read);
  resume.generation = static_cast<uint32_t>(generation->get<uint64_t>());
  resume.kind = kind != parsed.end() && kind->is_string() ? kind->get<std::string>() : "survivors";
  std::set<std::string> named;
  for (const Json& entry : *sources) {
    const auto file = entry.is_object() ? entry.find("file") : entry.end();
    const auto rank = entry.is_object() ? entry.find("rank") : entry.end();
    if (file == entry.end() || !file->is_string() || rank == entry.end() ||
        !rank->is_number_integer()) {
      return bad("a source needs \"file\" and \"rank\"");
    }
    MemoryResume::Source out{file->get<std::string>(), rank->get<int64_t>()};
    if (!resume.manifest.files.contains(out.file)) {
      return bad("source file '" + out.file + "' is not in the manifest");
    }
    if (out.rank < 0 || out.rank >= world) {
      return bad("source rank " + std::to_string(out.rank) + " of '" + out.file +
                 "' is outside the world of " + std::to_string(world));
    }
    if (!named.insert(out.file).second) return bad("file '" + out.file + "' has two sources");
    resume.sources.push_back(std::move(out));
  }
  for (const auto& [file, info] : resume.manifest.files) {
    if (!named.contains(file)) return bad("file '" + file + "' has no source");
  }
  return resume;
}

}  // namespace shardline::checkpoint
