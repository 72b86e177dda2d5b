// Routes the RPC client's frame events into the wire metrics of an agent or actor.
#pragma once

#include "monitoring/metrics.h"
#include "protocol/wire_observer.h"

namespace shardline::worker {

class MeteredWire final : public protocol::WireObserver {
 public:
  explicit MeteredWire(monitoring::WireMetrics& metrics) : metrics_(metrics) {}
  void OnSent(std::string_view payload) override { metrics_.OnSent(payload); }
  void OnReceived(std::string_view payload) override { metrics_.OnReceived(payload); }
  void OnDecodeError(std::string_view reason) override { metrics_.OnDecodeError(reason); }

 private:
  monitoring::WireMetrics& metrics_;
};

}  // namespace shardline::worker
