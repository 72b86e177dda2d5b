// What checkpoint writers do to the file system, behind one small interface (as leveldb's Env), so
// that a test can slow a write down or crash the process at any one of these operations and then
// check what a reader finds. Production code uses DefaultFileSystem(): POSIX, durable.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardline::checkpoint {

// A file that appears at its path only when committed: until then its bytes go to a temporary in
// the same directory, which is removed if the file is destroyed uncommitted. Not thread-safe.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual absl::Status Append(std::span<const std::byte> data) = 0;
  // fsync, rename over the final path, fsync of the directory: afterwards the path holds the
  // whole new file, even across a crash; before, the old file or none.
  virtual absl::Status Commit() = 0;
};

// Thread-safe: writers on several threads may share one.
class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Errors name the path and the failing call.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewAtomicFile(const std::string& path) = 0;
  virtual absl::Status CreateDirectories(const std::string& path) = 0;
  // A durable rename (the parent directory is fsynced); `to` must not exist.
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // Removes a file or a whole directory; a path that does not exist is not an error.
  virtual absl::Status RemoveAll(const std::string& path) = 0;
};

// POSIX, with every write made durable before it is visible. One instance for the process.
FileSystem& DefaultFileSystem();

// The concatenation of `parts`, or `text`, as one atomic file at `path`.
absl::Status WriteFileAtomically(FileSystem& fs, const std::string& path,
                                 std::span<const std::span<const std::byte>> parts);
absl::Status WriteFileAtomically(FileSystem& fs, const std::string& path, std::string_view text);

}  // namespace shardline::checkpoint
