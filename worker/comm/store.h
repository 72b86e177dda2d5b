// The key-value store that communicator bootstrap goes through, whatever the backend
// (Gloo rendezvous, NCCL unique-id exchange). A new job generation is a new key prefix.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardline::comm {

class Store {
 public:
  virtual ~Store() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Blocks until `key` is set, then returns its value; DeadlineExceeded naming the key after
  // `timeout`.
  virtual absl::StatusOr<std::string> Get(const std::string& key,
                                          std::chrono::milliseconds timeout) = 0;
  // Atomically adds `delta` to the integer at `key` (0 when absent) and returns the new value.
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
};

// Puts "prefix/" before every key of another store (like gloo::rendezvous::PrefixStore).
// Thread-safe when the wrapped store is.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, Store& inner) : prefix_(std::move(prefix)), inner_(inner) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return inner_.Set(prefix_ + "/" + key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  std::chrono::milliseconds timeout) override {
    return inner_.Get(prefix_ + "/" + key, timeout);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return inner_.Add(prefix_ + "/" + key, delta);
  }

 private:
  std::string prefix_;
  Store& inner_;
};

// A store in this process's memory, for ranks run as threads (tests, benchmarks). Thread-safe.
class InMemoryStore final : public Store {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  std::chrono::milliseconds timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

}  // namespace shardline::comm
