#include "worker/comm/store.h"

#include <string>

namespace shardline::comm {

absl::Status InMemoryStore::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
  }
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(const std::string& key,
                                               std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  // wait_until on a fixed deadline: spurious wake-ups and unrelated Sets must not extend the wait.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const bool found = changed_.wait_until(lock, deadline, [&] { return values_.count(key) > 0; });
  if (!found) {
    return absl::DeadlineExceededError("store key '" + key + "' was not set within " +
                                       std::to_string(timeout.count()) + " ms");
  }
  return values_.at(key);
}

absl::StatusOr<int64_t> InMemoryStore::Add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    int64_t current = 0;
    if (it != values_.end()) {
      try {
        size_t used = 0;
        current = std::stoll(it->second, &used);
        if (used != it->second.size()) throw std::invalid_argument("trailing characters");
      } catch (const std::exception&) {
        return absl::FailedPreconditionError("store key '" + key +
                                             "' holds a value that is not an integer, so Add "
                                             "cannot update it");
      }
    }
    result = current + delta;
    values_[key] = std::to_string(result);
  }
  changed_.notify_all();
  return result;
}

}  // namespace shardline::comm
