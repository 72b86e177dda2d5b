#include "coordinator/kv_store.h"

#include <charconv>

namespace shardline::coordinator {

std::vector<ParkedGet> KvStore::Set(const std::string& key, std::string value) {
  values_[key] = std::move(value);
  std::vector<ParkedGet> ready;
  std::vector<ParkedGet> still;
  for (auto& get : parked_) (get.key == key ? ready : still).push_back(std::move(get));
  parked_ = std::move(still);
  return ready;
}

std::optional<std::string> KvStore::Get(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<int64_t> KvStore::Add(const std::string& key, int64_t delta) {
  int64_t current = 0;
  auto it = values_.find(key);
  if (it != values_.end()) {
    const std::string& text = it->second;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), current);
    if (ec != std::errc() || end != text.data() + text.size()) {
      return absl::InvalidArgumentError("kv add: key '" + key + "' holds a non-integer value");
    }
  }
  current += delta;
  values_[key] = std::to_string(current);
  return current;
}

std::vector<ParkedGet> KvStore::ExpireParked(TimePoint now) {
  std::vector<ParkedGet> expired;
  std::vector<ParkedGet> still;
  for (auto& get : parked_) (get.deadline <= now ? expired : still).push_back(std::move(get));
  parked_ = std::move(still);
  return expired;
}

void KvStore::ErasePrefix(const std::string& prefix) {
  for (auto it = values_.lower_bound(prefix);
       it != values_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    it = values_.erase(it);
  }
  std::erase_if(parked_, [&](const ParkedGet& g) { return g.key.rfind(prefix, 0) == 0; });
}

}  // namespace shardline::coordinator
