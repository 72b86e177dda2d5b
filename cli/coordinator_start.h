// Starting a coordinator as a child process and learning where it listens: what `shardline up`
// and the first node of `shardline slurm` both do.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "absl/status/statusor.h"

namespace shardline::cli {

// A file's whole text ("" when it cannot be read).
std::string ReadWholeFile(const std::filesystem::path& path);

// The last `lines` lines of a file, each indented, for an error message.
std::string TailOfFile(const std::filesystem::path& path, size_t lines);

// Waits until the coordinator `pid` (spawned with `--endpoint-file endpoint_file`) has written
// its endpoint, and returns it. Errors when it exits first (`pid` is then reaped and set to 0;
// the tail of `log`, when given, says why) or after `timeout`.
absl::StatusOr<std::string> AwaitCoordinatorEndpoint(pid_t& pid,
                                                     const std::filesystem::path& endpoint_file,
                                                     std::chrono::seconds timeout,
                                                     const std::filesystem::path& log = {});

}  // namespace shardline::cli
