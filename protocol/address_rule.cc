#include "protocol/address_rule.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_join.h"

namespace shardline::protocol {
namespace {

struct HostPort {
  std::string host, port;
};

absl::StatusOr<HostPort> SplitEndpoint(const std::string& endpoint) {
  std::string rest = endpoint;
  const auto scheme = rest.find("://");
  if (scheme != std::string::npos) rest = rest.substr(scheme + 3);
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError("endpoint '" + endpoint + "' has no port");
  }
  return HostPort{rest.substr(0, colon), rest.substr(colon + 1)};
}

// Every (interface, IPv4 address) pair of this host, in the kernel's order.
std::vector<std::pair<std::string, std::string>> InterfaceAddresses() {
  std::vector<std::pair<std::string, std::string>> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if ((it->ifa_flags & IFF_UP) == 0) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, buf, sizeof(buf));
    out.emplace_back(it->ifa_name, buf);
  }
  freeifaddrs(list);
  return out;
}

bool IsIpv4(const std::string& text) {
  in_addr parsed{};
  return inet_pton(AF_INET, text.c_str(), &parsed) == 1;
}

}  // namespace

absl::StatusOr<std::string> InterfaceAddress(const std::string& interface) {
  std::vector<std::string> seen;
  for (const auto& [name, address] : InterfaceAddresses()) {
    if (name == interface) return address;
    seen.push_back(name + " " + address);
  }
  return absl::NotFoundError("interface '" + interface +
                             "' has no IPv4 address or is down; this host has: " +
                             (seen.empty() ? std::string("none") : absl::StrJoin(seen, ", ")));
}

std::string InterfaceHolding(const std::string& address) {
  for (const auto& [name, held] : InterfaceAddresses()) {
    if (held == address) return name;
  }
  return "";
}

absl::StatusOr<std::string> LocalAddressFor(const std::string& endpoint) {
  auto split = SplitEndpoint(endpoint);
  if (!split.ok()) return split.status();
  const std::string& host = split->host;
  if (host == "*" || host.empty()) return std::string("127.0.0.1");
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "9", &hints, &result); rc != 0) {
    return absl::InvalidArgumentError("cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  // No packet is sent: connect() on a UDP socket only asks the routing table for the source
  // address it would use.
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  std::string address;
  if (fd >= 0 && connect(fd, result->ai_addr, result->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf));
      address = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(result);
  if (address.empty()) return absl::UnavailableError("no route to " + host);
  return address;
}

absl::StatusOr<AdvertisedAddress> ChooseAdvertisedAddress(const std::string& explicit_address,
                                                          const std::string& interface,
                                                          const std::string& toward) {
  if (!explicit_address.empty()) {
    if (!IsIpv4(explicit_address)) {
      return absl::InvalidArgumentError("--advertise-address '" + explicit_address +
                                        "' is not an IPv4 address (a host name would have to "
                                        "resolve on every other node)");
    }
    return AdvertisedAddress{explicit_address, InterfaceHolding(explicit_address),
                             "--advertise-address"};
  }
  if (!interface.empty()) {
    auto address = InterfaceAddress(interface);
    if (!address.ok()) return address.status();
    return AdvertisedAddress{*address, interface, "--interface " + interface};
  }
  auto address = LocalAddressFor(toward);
  if (!address.ok()) {
    return absl::Status(address.status().code(), "choosing the address to advertise: " +
                                                     std::string(address.status().message()) +
                                                     " (the route to the coordinator at " + toward +
                                                     "); give --advertise-address or --interface");
  }
  const std::string holder = InterfaceHolding(*address);
  return AdvertisedAddress{
      *address, holder,
      "the interface " + (holder.empty() ? std::string("?") : holder) + " routes to " + toward};
}

std::string WithHost(const std::string& endpoint, const std::string& address) {
  auto split = SplitEndpoint(endpoint);
  if (!split.ok()) return endpoint;
  const auto scheme = endpoint.find("://");
  const std::string prefix = scheme == std::string::npos ? "" : endpoint.substr(0, scheme + 3);
  return prefix + address + ":" + split->port;
}

bool HasWildcardHost(const std::string& endpoint) {
  auto split = SplitEndpoint(endpoint);
  return split.ok() && (split->host.empty() || split->host == "*" || split->host == "0.0.0.0");
}

}  // namespace shardline::protocol
