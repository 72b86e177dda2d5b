// The coordinator's key-value store for communicator bootstrap (Gloo rendezvous, NCCL unique-id
// fan-out). A get of a missing key is parked until the key is set or its deadline passes.
// Not thread-safe: owned by the coordinator's event loop.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"

namespace shardline::coordinator {

// A get that waits: who asked, so that the answer can be sent when it comes.
struct ParkedGet {
  std::string key;
  std::string peer;
  uint64_t request_id = 0;
  std::string sender;
  TimePoint deadline;
};

// What one namespace of the store may hold: a job's keys ("job/ID/...") are one namespace each,
// every other key shares one. A runaway or hostile actor fills its own job's quota, not the
// coordinator's memory. Bytes count keys and values.
struct KvQuota {
  size_t keys = 65536;
  size_t bytes = size_t{64} << 20;
};

class KvStore {
 public:
  explicit KvStore(KvQuota quota = {}) : quota_(quota) {}

  // Whether setting `key` to a value of `value_bytes` bytes stays within its namespace's quota;
  // ResourceExhausted naming the namespace and the limit otherwise.
  absl::Status CheckQuota(const std::string& key, size_t value_bytes) const;

  // Sets `key` and returns the parked gets it satisfies (removed from the parked list).
  std::vector<ParkedGet> Set(const std::string& key, std::string value);
  std::optional<std::string> Get(const std::string& key) const;
  // Adds `delta` to the decimal integer at `key` (0 when absent). InvalidArgument when the value
  // there is not an integer.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);

  void Park(ParkedGet get) { parked_.push_back(std::move(get)); }
  // Removes and returns the parked gets whose deadline has passed.
  std::vector<ParkedGet> ExpireParked(TimePoint now);

  // Drops every key (and parked get) under `prefix`: a generation's keys when it ends.
  void ErasePrefix(const std::string& prefix);

  size_t size() const { return values_.size(); }
  size_t parked() const { return parked_.size(); }

 private:
  struct Usage {
    size_t keys = 0, bytes = 0;
  };
  // "job/ID/" for a job's keys, "" for the rest.
  static std::string NamespaceOf(const std::string& key);
  void Put(const std::string& key, std::string value);

  KvQuota quota_;
  std::map<std::string, Usage> usage_;  // by namespace
  std::map<std::string, std::string> values_;
  std::vector<ParkedGet> parked_;
};

}  // namespace shardline::coordinator
