// The one HTTP endpoint a process exports its Prometheus metrics on.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace shardline::monitoring {

// Owns a prometheus::Registry and, unless started without an address, a prometheus::Exposer
// serving it at http://HOST:PORT/metrics from civetweb's own threads.
//
// Thread-safety: every method is safe to call from any thread; the registry is thread-safe.
// Metric structs built on registry() keep the registry alive, so they may outlive the server
// (the values simply stop being served).
class MetricsServer {
 public:
  // `host_port` is "HOST:PORT": HOST an IPv4 address, "[IPv6]" (only where civetweb was built
  // with IPv6, which Debian's is not), a resolvable name such as "localhost" (IPv4 preferred),
  // or empty for every interface (":9100"); PORT 0 picks an ephemeral port.
  // An empty `host_port` serves nothing: the registry alone, for tests and one-shot tools.
  // Errors: InvalidArgument for a malformed address, Unavailable when the address cannot be
  // bound ("metrics: cannot listen on 127.0.0.1:9100: address already in use").
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& host_port);

  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // "HOST:PORT" actually bound (the real port when asked for 0); empty when not serving.
  const std::string& address() const { return address_; }
  bool serving() const { return exposer_ != nullptr; }

  // The registry in the Prometheus text exposition format, exactly what GET /metrics returns;
  // for tools that print metrics without a server.
  std::string Scrape() const;

 private:
  MetricsServer(std::shared_ptr<prometheus::Registry> registry,
                std::unique_ptr<prometheus::Exposer> exposer, std::string address,
                std::string wake_host, int port);

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;
  // Where the destructor connects to cut civetweb's shutdown short: the bound numeric host
  // (loopback when bound to every interface) and port.
  std::string wake_host_;
  int port_ = 0;
};

}  // namespace shardline::monitoring
