// The memory tier of a train job's checkpoints (checkpoint.memory_interval), as both sides see it:
// where a node keeps a job's memory steps, and what the coordinator tells the ranks of a new
// generation that resumes from one (Assignment.memoryResume).
//
// A memory step is a checkpoint step like a disk one (one safetensors file per rank, the same
// manifest, the same resharding reader); only its files live in the nodes' memory stores, which
// outlive the ranks that wrote them (a tmpfs, /dev/shm by default), and the coordinator keeps its
// manifest in its own memory rather than writing it:
//
//   STORE/JOB/g3/step-00000042/rank-00001.safetensors   a rank's shard, or its buddy's replica
//   STORE/JOB/g3/step-00000042/manifest.json            written by a resuming rank, for its reader
//
// STORE is the node's (`shardline agent --memory-store`); g3 the generation whose ranks wrote the
// step, so that a later generation never writes over a step it may resume from.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/manifest.h"

namespace shardline::checkpoint {

// STORE/JOB: everything a node holds for one job (the agent removes it when the job ends).
// InvalidArgument for a job id that is not one plain file name (the coordinator's are "NAME-N"):
// nothing is ever made or removed outside the store.
absl::StatusOr<std::string> MemoryJobDir(const std::string& store, const std::string& job_id);
// STORE/JOB/gG: the folder StepDir()s of generation G's memory steps live in.
absl::StatusOr<std::string> MemoryGenerationDir(const std::string& store, const std::string& job_id,
                                                uint32_t generation);

// What a new generation resumes from when the coordinator chose a memory step.
struct MemoryResume {
  Manifest manifest;        // the step's (ParseManifest validates it)
  uint32_t generation = 0;  // the generation that wrote it: its folder in the stores
  struct Source {
    std::string file;  // a file of the manifest
    int64_t rank = 0;  // the rank of the new generation that sends it: one on a node holding it
  };
  std::vector<Source> sources;  // one per file of the manifest
  // Which copy the sources hold: "survivors" (every file from its writer's node) or "memory
  // replica" (some from the node of a buddy that received a copy).
  std::string kind;
};

std::string MemoryResumeToJson(const MemoryResume& resume);
// InvalidArgument naming `source` for malformed JSON, an invalid manifest, or sources that do not
// name each file of the manifest exactly once with a rank in [0, world).
absl::StatusOr<MemoryResume> ParseMemoryResume(std::string_view json, int64_t world,
                                               const std::string& source);

}  // namespace shardline::checkpoint
