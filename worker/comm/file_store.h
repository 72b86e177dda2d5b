// A comm::Store over a directory that every rank can reach (one host, or a shared file system),
// built on gloo::rendezvous::FileStore. For ranks run as separate processes without a coordinator:
// multi-process tests and benchmarks. Thread-safe; safe across processes.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/comm/store.h"

namespace gloo::rendezvous {
class FileStore;
}

namespace shardline::comm {

class FileStore final : public Store {
 public:
  // `directory` must exist. Keys may hold any characters (files are named after a hash of the key).
  static absl::StatusOr<std::unique_ptr<FileStore>> Open(const std::string& directory);
  ~FileStore() override;

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  std::chrono::milliseconds timeout) override;
  // Atomic across processes (flock on a per-key lock file).
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  class Files;
  FileStore(std::string directory, std::unique_ptr<Files> files);

  std::string directory_;
  std::unique_ptr<Files> files_;
};

}  // namespace shardline::comm
