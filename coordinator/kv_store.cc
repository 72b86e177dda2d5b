#include "coordinator/kv_store.h"

#include <charconv>

namespace shardline::coordinator {

std::string KvStore::NamespaceOf(const std::string& key) {
  if (key.rfind("job/", 0) != 0) return "";
  const auto slash = key.find('/', 4);
  return slash == std::string::npos ? key + "/" : key.substr(0, slash + 1);
}

absl::Status KvStore::CheckQuota(const std::string& key, size_t value_bytes) const {
  const std::string space = NamespaceOf(key);
  Usage usage;
  if (auto it = usage_.find(space); it != usage_.end()) usage = it->second;
  if (auto old = values_.find(key); old != values_.end()) {
    usage.keys -= 1;
    usage.bytes -= key.size() + old->second.size();
  }
  const std::string name = space.empty() ? "the store's shared namespace" : "namespace " + space;
  if (usage.keys + 1 > quota_.keys) {
    return absl::ResourceExhaustedError("kv: " + name + " holds " + std::to_string(usage.keys) +
                                        " keys, its quota");
  }
  if (usage.bytes + key.size() + value_bytes > quota_.bytes) {
    return absl::ResourceExhaustedError("kv: setting '" + key + "' (" +
                                        std::to_string(value_bytes) + " bytes) would take " +
                                        name + " past its quota of " +
                                        std::to_string(quota_.bytes) + " bytes");
  }
  return absl::OkStatus();
}

void KvStore::Put(const std::string& key, std::string value) {
  Usage& usage = usage_[NamespaceOf(key)];
  auto [it, inserted] = values_.try_emplace(key);
  if (inserted) {
    usage.keys += 1;
  } else {
    usage.bytes -= key.size() + it->second.size();
  }
  usage.bytes += key.size() + value.size();
  it->second = std::move(value);
}

std::vector<ParkedGet> KvStore::Set(const std::string& key, std::string value) {
  Put(key, std::move(value));
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
  Put(key, std::to_string(current));
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
    const std::string space = NamespaceOf(it->first);
    Usage& usage = usage_[space];
    usage.keys -= 1;
    usage.bytes -= it->first.size() + it->second.size();
    if (usage.keys == 0) usage_.erase(space);
    it = values_.erase(it);
  }
  std::erase_if(parked_, [&](const ParkedGet& g) { return g.key.rfind(prefix, 0) == 0; });
}

}  // namespace shardline::coordinator
