// The one rule by which every Shardline process picks the address it advertises to its peers —
// agents, actors (their ZeroMQ, Gloo and NCCL sockets), the coordinator's published endpoint and
// the launchers (SLURM, Kubernetes, Ray) alike:
//   1. an explicit address (--advertise-address) wins;
//   2. else an explicit interface's IPv4 address (--interface);
//   3. else the address of the interface that routes to the coordinator, asked of the kernel's
//      routing table with an unconnected UDP socket (as NCCL and Gloo find theirs).
// Never a host name that another node would have to resolve.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace shardline::protocol {

struct AdvertisedAddress {
  std::string address;    // dotted IPv4
  std::string interface;  // the local interface holding it ("" when none does, e.g. a NAT)
  std::string how;        // why this one, for logs and errors: "--interface eth1", ...
};

// `toward` is the coordinator's endpoint (tcp://HOST:PORT or HOST:PORT). Errors say what was
// given and what was tried.
absl::StatusOr<AdvertisedAddress> ChooseAdvertisedAddress(const std::string& explicit_address,
                                                          const std::string& interface,
                                                          const std::string& toward);

// The IPv4 address of a local interface; an error lists the interfaces there are.
absl::StatusOr<std::string> InterfaceAddress(const std::string& interface);

// The local interface holding `address`; "" when none does.
std::string InterfaceHolding(const std::string& address);

// The local address this host uses to reach `endpoint`'s host (rule 3).
absl::StatusOr<std::string> LocalAddressFor(const std::string& endpoint);

// `endpoint` (tcp://HOST:PORT) with HOST replaced by `address`.
std::string WithHost(const std::string& endpoint, const std::string& address);

// Whether `endpoint`'s host is a wildcard (*, 0.0.0.0 or empty): bound on every interface.
bool HasWildcardHost(const std::string& endpoint);

}  // namespace shardline::protocol
