// A minimal blocking HTTP/1.0 GET over a plain TCP socket, so that tests can scrape a
// MetricsServer or query a Prometheus server without curl or an HTTP client library.
#pragma once

#include <chrono>
#include <string>

#include "absl/status/statusor.h"

namespace shardline::monitoring::testing {

struct HttpResponse {
  int status = 0;    // e.g. 200
  std::string body;  // everything after the header block
};

// GETs http://`host_port``path` ("127.0.0.1:9100", "/metrics"). HOST must be numeric (IPv4 or
// bracketed IPv6). Unavailable when the connection fails; DeadlineExceeded after `timeout`.
// Thread-safe (no shared state).
absl::StatusOr<HttpResponse> HttpGet(const std::string& host_port, const std::string& path,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(5));

}  // namespace shardline::monitoring::testing
