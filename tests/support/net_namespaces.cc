#include "tests/support/net_namespaces.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string_view>

namespace shardline::testing {
namespace {

// Runs `command` through the shell, its output kept for the error; the status says what failed.
absl::Status Run(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("cannot run: " + command);
  char buf[256];
  while (std::fgets(buf, sizeof(buf), pipe) != nullptr) output += buf;
  const int status = ::pclose(pipe);
  if (status != 0) {
    return absl::FailedPreconditionError("`" + command + "` failed (status " +
                                         std::to_string(status) + "): " + output);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<NetNamespaces> NetNamespaces::Create(int hosts) {
  NetNamespaces made;
  const int id = static_cast<int>(::getpid() % 100000);
  made.prefix_ = "sl" + std::to_string(id);
  made.subnet_ = "10.231." + std::to_string(id % 250);
  made.bridge_ = made.prefix_ + "b";
  auto step = [&made](const std::string& command) -> absl::Status {
    absl::Status status = Run(command);
    if (!status.ok()) made.Remove();
    return status;
  };
  absl::Status status = step("ip link add " + made.bridge_ + " type bridge");
  if (!status.ok()) return status;
  made.links_.push_back(made.bridge_);
  for (const std::string& command :
       {"ip addr add " + made.address(0) + "/24 dev " + made.bridge_,
        "ip link set " + made.bridge_ + " up"}) {
    if (status = step(command); !status.ok()) return status;
  }
  for (int host = 1; host <= hosts; ++host) {
    const std::string ns = made.prefix_ + "h" + std::to_string(host);
    const std::string outside = made.prefix_ + "v" + std::to_string(host);
    if (status = step("ip netns add " + ns); !status.ok()) return status;
    made.namespaces_.push_back(ns);
    if (status = step("ip link add " + outside + " type veth peer name eth0 netns " + ns);
        !status.ok()) {
      return status;
    }
    made.links_.push_back(outside);
    for (const std::string& command :
         {"ip link set " + outside + " master " + made.bridge_,
          "ip link set " + outside + " up",
          "ip -n " + ns + " addr add " + made.address(host) + "/24 dev eth0",
          "ip -n " + ns + " link set eth0 up", "ip -n " + ns + " link set lo up"}) {
      if (status = step(command); !status.ok()) return status;
    }
  }
  return made;
}

NetNamespaces::NetNamespaces(NetNamespaces&& other) noexcept
    : prefix_(std::move(other.prefix_)),
      subnet_(std::move(other.subnet_)),
      bridge_(std::move(other.bridge_)),
      namespaces_(std::move(other.namespaces_)),
      links_(std::move(other.links_)) {
  other.namespaces_.clear();
  other.links_.clear();
}

NetNamespaces::~NetNamespaces() { Remove(); }

void NetNamespaces::Remove() {
  // The veth pairs go with their namespaces; the bridge goes last.
  for (const std::string& ns : namespaces_) (void)Run("ip netns pids " + ns + " | xargs -r kill -9");
  for (const std::string& ns : namespaces_) (void)Run("ip netns del " + ns);
  for (const std::string& link : links_) (void)Run("ip link del " + link + " 2>/dev/null || true");
  namespaces_.clear();
  links_.clear();
}

std::string NetNamespaces::address(int host) const {
  return subnet_ + "." + std::to_string(host + 1);
}

absl::Status NetNamespaces::AddDecoyInterface(int host) {
  const std::string& ns = netns(host);
  for (const std::string& command :
       // A veth pair with both ends inside (the VMs here have no `dummy` module).
       {"ip -n " + ns + " link add decoy0 type veth peer name decoy1",
        "ip -n " + ns + " addr add " + decoy_address(host) + "/24 dev decoy0",
        "ip -n " + ns + " link set decoy1 up", "ip -n " + ns + " link set decoy0 up"}) {
    if (absl::Status status = Run(command); !status.ok()) return status;
  }
  return absl::OkStatus();
}

std::string NetNamespaces::decoy_address(int host) const {
  // The same third octet one above the bridge's: another /24, the bridge's never.
  const size_t dot = subnet_.rfind('.');
  const int octet = std::stoi(subnet_.substr(dot + 1));
  return subnet_.substr(0, dot) + "." + std::to_string((octet + 1) % 256) + "." +
         std::to_string(host + 1);
}

namespace {

// tbf sends at most `burst` bytes back to back, then at `rate`. The burst must hold what the rate
// earns in one timer tick (rate/HZ; HZ is 100..1000, 250 assumed here: a smaller burst caps the
// rate below the one asked for) and at least one packet: veth hands tbf GSO packets of up to
// 64 KiB, which tbf splits only when they exceed the burst, so 128 KiB keeps that path out.
// Larger bursts let the first bytes of a transfer through at memory speed, which at 100 Mbit is
// 128 KiB of a 4 MiB message: 3%.
constexpr int64_t kAssumedHz = 250;
constexpr int64_t kMinBurstBytes = 128 * 1024;
// The queue behind the bucket: 50 ms at the rate, at least 256 KiB. Too short a queue drops a
// TCP window's worth at high rates (12.5 MB is 10 ms at 10 Gbit) and TCP then measures its own
// recovery, not the link; too long a one only adds queueing delay, which does not change the rate.
constexpr int64_t kQueueMilliseconds = 50;
constexpr int64_t kMinQueueBytes = 256 * 1024;
constexpr int64_t kMinBitsPerSecond = 8000;

std::string TbfArguments(int64_t bits_per_second) {
  const int64_t bytes_per_second = bits_per_second / 8;
  const int64_t burst = std::max(bytes_per_second / kAssumedHz, kMinBurstBytes);
  const int64_t queue = std::max(bytes_per_second / 1000 * kQueueMilliseconds, kMinQueueBytes);
  return "tbf rate " + std::to_string(bits_per_second) + "bit burst " + std::to_string(burst) +
         " limit " + std::to_string(burst + queue);
}

// Deleting a root qdisc that is the default already fails with one of these: not an error here.
bool NothingToDelete(const absl::Status& status) {
  const std::string_view message(status.message().data(), status.message().size());
  return message.find("handle of zero") != std::string_view::npos ||
         message.find("No such file or directory") != std::string_view::npos;
}

}  // namespace

absl::Status NetNamespaces::SetRate(int host, int64_t bits_per_second) {
  if (host < 1 || host > static_cast<int>(namespaces_.size())) {
    return absl::InvalidArgumentError("SetRate: no host " + std::to_string(host) + " (hosts 1.." +
                                      std::to_string(namespaces_.size()) + ")");
  }
  if (bits_per_second < kMinBitsPerSecond) {
    return absl::InvalidArgumentError(
        "SetRate of host " + std::to_string(host) + ": " + std::to_string(bits_per_second) +
        " bit/s is below the smallest rate, " + std::to_string(kMinBitsPerSecond) + " bit/s");
  }
  const std::string tbf = TbfArguments(bits_per_second);
  for (const std::string& command :
       {"ip netns exec " + netns(host) + " tc qdisc replace dev eth0 root " + tbf,
        "tc qdisc replace dev " + links_.at(static_cast<size_t>(host)) + " root " + tbf}) {
    if (absl::Status status = Run(command); !status.ok()) {
      return absl::FailedPreconditionError("cannot shape host " + std::to_string(host) +
                                           "'s link with tc: " + std::string(status.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status NetNamespaces::ClearRate(int host) {
  if (host < 1 || host > static_cast<int>(namespaces_.size())) {
    return absl::InvalidArgumentError("ClearRate: no host " + std::to_string(host));
  }
  for (const std::string& command :
       {"ip netns exec " + netns(host) + " tc qdisc del dev eth0 root",
        "tc qdisc del dev " + links_.at(static_cast<size_t>(host)) + " root"}) {
    if (absl::Status status = Run(command); !status.ok() && !NothingToDelete(status)) {
      return status;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<NetNamespaces::LinkBytes> NetNamespaces::LinkCounters(int host) const {
  if (host < 1 || host > static_cast<int>(namespaces_.size())) {
    return absl::InvalidArgumentError("LinkCounters: no host " + std::to_string(host));
  }
  const std::string dir = "/sys/class/net/" + links_.at(static_cast<size_t>(host)) + "/statistics/";
  auto read = [&](const std::string& name) -> absl::StatusOr<int64_t> {
    std::ifstream in(dir + name);
    int64_t value = -1;
    if (!(in >> value) || value < 0) {
      return absl::FailedPreconditionError("cannot read a byte count from " + dir + name);
    }
    return value;
  };
  // The root-side end receives what leaves the namespace (its upload) and sends what enters it.
  auto uploaded = read("rx_bytes");
  if (!uploaded.ok()) return uploaded.status();
  auto downloaded = read("tx_bytes");
  if (!downloaded.ok()) return downloaded.status();
  return LinkBytes{*uploaded, *downloaded};
}

absl::Status NetNamespaces::SetLink(int host, bool up) {
  return Run("ip link set " + links_.at(static_cast<size_t>(host)) + (up ? " up" : " down"));
}

}  // namespace shardline::testing
