#include "monitoring/metrics_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "common/status_macros.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace shardline::monitoring {
namespace {

// A listen address split and resolved to numbers, because civetweb's "listening_ports" accepts
// only numeric hosts and says nothing useful when it cannot bind.
struct ListenAddress {
  std::string host;  // numeric; IPv6 without brackets
  bool ipv6 = false;
  int port = 0;

  // The form civetweb and people read: "127.0.0.1:9100", "[::1]:9100".
  std::string Format(int with_port) const {
    return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(with_port);
  }
};

absl::StatusOr<ListenAddress> ParseListenAddress(const std::string& host_port) {
  auto invalid = [&](const std::string& why) {
    return absl::InvalidArgumentError("metrics: bad listen address '" + host_port + "': " + why +
                                      " (want HOST:PORT, e.g. 127.0.0.1:9100)");
  };
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return invalid("no port");
  std::string host = host_port.substr(0, colon);
  const std::string port_text = host_port.substr(colon + 1);

  ListenAddress out;
  if (port_text.empty() || port_text.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(port_text, &out.port) || out.port > 65535) {
    return invalid("port '" + port_text + "' is not a number in 0..65535");
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    in6_addr ignored;
    if (inet_pton(AF_INET6, host.c_str(), &ignored) != 1) return invalid("bad IPv6 address");
    out.host = host;
    out.ipv6 = true;
    return out;
  }
  if (host.find_first_of("[]:") != std::string::npos) {
    return invalid("IPv6 addresses go in brackets, e.g. [::1]:9100");
  }
  if (host.empty()) {
    out.host = "0.0.0.0";
    return out;
  }
  in_addr ignored;
  if (inet_pton(AF_INET, host.c_str(), &ignored) == 1) {
    out.host = host;
    return out;
  }
  // Not a name: the resolver would send "300.1.2.3" to DNS and wait for its timeout.
  if (host.find_first_not_of("0123456789.") == std::string::npos)
    return invalid("bad IPv4 address");
  // A name such as "localhost": prefer IPv4, which is what scrape configs usually name.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* results = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &results); rc != 0) {
    return invalid("cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  const addrinfo* chosen = results;
  for (const addrinfo* r = results; r != nullptr; r = r->ai_next) {
    if (r->ai_family == AF_INET) {
      chosen = r;
      break;
    }
  }
  char text[INET6_ADDRSTRLEN] = {};
  if (chosen->ai_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(chosen->ai_addr)->sin_addr, text,
              sizeof(text));
  } else {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(chosen->ai_addr)->sin6_addr, text,
              sizeof(text));
    out.ipv6 = true;
  }
  freeaddrinfo(results);
  out.host = text;
  return out;
}

std::string DescribeBindErrno(int err) {
  switch (err) {
    case EADDRINUSE:
      return "address already in use";
    case EADDRNOTAVAIL:
      return "address not available on this host";
    case EACCES:
      return "permission denied (ports below 1024 need privileges)";
    default:
      return std::strerror(err);
  }
}

// civetweb reports a failed bind only as "null context when constructing CivetServer"; binding
// the same address ourselves recovers the reason a person can act on. Returns empty when the
// bind works now (the port was freed meanwhile, or the failure was something else).
std::string DiagnoseBindFailure(const ListenAddress& address) {
  const int fd = ::socket(address.ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return DescribeBindErrno(errno);
  // civetweb sets SO_REUSEADDR too; without it a port in TIME_WAIT would look busy here only.
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int rc;
  if (address.ipv6) {
    sockaddr_in6 sa{};
    sa.sin6_family = AF_INET6;
    sa.sin6_port = htons(static_cast<uint16_t>(address.port));
    inet_pton(AF_INET6, address.host.c_str(), &sa.sin6_addr);
    rc = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  } else {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(address.port));
    inet_pton(AF_INET, address.host.c_str(), &sa.sin_addr);
    rc = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  }
  const int err = errno;
  ::close(fd);
  return rc == 0 ? std::string() : DescribeBindErrno(err);
}

// Opens and drops one connection to host:port without waiting for it to complete.
void Poke(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  const int fd = ::socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  if (ipv6) {
    sockaddr_in6 sa{};
    sa.sin6_family = AF_INET6;
    sa.sin6_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET6, host.c_str(), &sa.sin6_addr);
    ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  } else {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, host.c_str(), &sa.sin_addr);
    ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  }
  ::close(fd);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& host_port) {
  auto registry = std::make_shared<prometheus::Registry>();
  if (host_port.empty()) {
    return std::unique_ptr<MetricsServer>(
        new MetricsServer(std::move(registry), nullptr, "", "", 0));
  }
  ASSIGN_OR_RETURN(const ListenAddress address, ParseListenAddress(host_port));
  const std::string requested = address.Format(address.port);

  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // Two threads: Prometheus scrapes rarely, and every process (each actor too) runs one.
    exposer = std::make_unique<prometheus::Exposer>(requested, /*num_threads=*/2);
  } catch (const std::exception& e) {
    std::string reason = DiagnoseBindFailure(address);
    if (reason.empty() && address.ipv6) {
      // Debian's civetweb is built without IPv6 and then fails every IPv6 address this way.
      reason = "the installed civetweb does not listen on IPv6 addresses; use an IPv4 one";
    }
    if (reason.empty()) reason = e.what();
    return absl::UnavailableError("metrics: cannot listen on " + requested + ": " + reason);
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::InternalError("metrics: listening on " + requested +
                               " but the server reports no bound port");
  }
  exposer->RegisterCollectable(registry);
  std::string bound = address.Format(ports.front());
  std::string wake_host = address.host;
  if (wake_host == "0.0.0.0") wake_host = "127.0.0.1";
  if (wake_host == "::") wake_host = "::1";
  return std::unique_ptr<MetricsServer>(new MetricsServer(
      std::move(registry), std::move(exposer), std::move(bound), wake_host, ports.front()));
}

MetricsServer::MetricsServer(std::shared_ptr<prometheus::Registry> registry,
                             std::unique_ptr<prometheus::Exposer> exposer, std::string address,
                             std::string wake_host, int port)
    : registry_(std::move(registry)),
      exposer_(std::move(exposer)),
      address_(std::move(address)),
      wake_host_(std::move(wake_host)),
      port_(port) {}

MetricsServer::~MetricsServer() {
  if (exposer_ == nullptr) return;
  // civetweb's accept thread looks at its stop flag only when its poll() returns, which without
  // traffic takes up to 2 s; every process exit would wait that long. A connection ends the poll
  // at once, so keep connecting until the Exposer is gone.
  std::atomic<bool> stopped{false};
  std::thread waker([&] {
    while (!stopped.load()) {
      Poke(wake_host_, port_);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  exposer_.reset();
  stopped.store(true);
  waker.join();
}

std::string MetricsServer::Scrape() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace shardline::monitoring
