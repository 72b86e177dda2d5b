// Several hosts on one machine for the multi-host tests: a Linux network namespace per host, each
// with a veth pair whose other end is on a bridge in the root namespace, so that processes in
// different namespaces talk over real TCP by their own addresses (10.X.Y.N/24), and a test can
// cut one host's link. Needs root (CAP_NET_ADMIN) and `ip`; Create says why when it cannot.
// Everything made is removed by the destructor, also when the test fails; names carry the pid so
// that parallel tests do not collide.
//
// Slow links: SetRate shapes one host's link with `tc` (tbf) in both directions. Bandwidth only:
// latency is NOT emulated. The kernels here have no `netem` ("Specified qdisc kind is unknown"),
// and tbf's `latency` bounds the time a packet may queue, it adds none; a round trip stays at
// memory speed (tens of microseconds), so a link here is a fat short pipe, not a long one.
#pragma once

#include <cstdint>
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
  // Limits host `host`'s link to `bits_per_second` each way: its upload (the egress of its
  // namespace's eth0) and its download (the egress of its veth end on the bridge). Traffic between
  // two shaped hosts passes both shapers. The qdiscs live on the veth pair, which goes with the
  // namespace, so the destructor removes them too. InvalidArgument for a rate below 8 kbit/s;
  // FailedPrecondition, with tc's words, when `tc` is missing or refuses (callers skip on it).
  absl::Status SetRate(int host, int64_t bits_per_second);
  // Back to an unshaped link (both directions); OK when it was not shaped.
  absl::Status ClearRate(int host);
  // What host `host` has sent and received on its link so far: the byte counters of its veth end
  // on the bridge (whole frames, headers included; a frame a shaper dropped is not counted).
  struct LinkBytes {
    int64_t uploaded = 0;
    int64_t downloaded = 0;
  };
  absl::StatusOr<LinkBytes> LinkCounters(int host) const;

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
