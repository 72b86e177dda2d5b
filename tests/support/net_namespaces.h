// Several hosts on one machine for the multi-host tests: a Linux network namespace per host, each
// with a veth pair whose other end is on a bridge in the root namespace, so that processes in
// different namespaces talk over real TCP by their own addresses (10.X.Y.N/24), and a test can
// cut one host's link. Needs root (CAP_NET_ADMIN) and `ip`; Create says why when it cannot.
// Everything made is removed by the destructor, also when the test fails; names carry the pid so
// that parallel tests do not collide.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shardline::testing {

class NetNamespaces {
 public:
  // `hosts` namespaces on a bridge whose root-side address is host_address(0).
  static absl::StatusOr<NetNamespaces> Create(int hosts);
  NetNamespaces(NetNamespaces&& other) noexcept;
  NetNamespaces& operator=(NetNamespaces&&) = delete;
  ~NetNamespaces();

  const std::string& netns(int host) const { return namespaces_.at(host - 1); }  // host 1..n
  // The root namespace (0) and each host's (1..n) address.
  std::string address(int host) const;
  // Takes host `host`'s link down or up (its veth end on the bridge).
  absl::Status SetLink(int host, bool up);
  // Gives host `host` a second interface, `decoy0`, with decoy_address(host) on a subnet of its
  // own that routes nowhere: the address a careless choice (the first interface, the host name)
  // would advertise, that no other host can reach.
  absl::Status AddDecoyInterface(int host);
  std::string decoy_address(int host) const;

 private:
  NetNamespaces() = default;
  void Remove();

  std::string prefix_;   // "sl12345"
  std::string subnet_;   // "10.231.45"
  std::string bridge_;
  std::vector<std::string> namespaces_;
  std::vector<std::string> links_;  // root-side veth ends
};

}  // namespace shardline::testing
