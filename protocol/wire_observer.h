// Told about every frame a channel user sends, receives or refuses: the hook for the
// messages-by-type and decode-error metrics, without protocol/ knowing about Prometheus.
#pragma once

#include <string_view>

namespace shardline::protocol {

class WireObserver {
 public:
  virtual ~WireObserver() = default;
  virtual void OnSent(std::string_view payload) = 0;
  virtual void OnReceived(std::string_view payload) = 0;
  virtual void OnDecodeError(std::string_view reason) = 0;
};

}  // namespace shardline::protocol
