#include "tests/support/net_namespaces.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

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

absl::Status NetNamespaces::SetLink(int host, bool up) {
  return Run("ip link set " + links_.at(static_cast<size_t>(host)) + (up ? " up" : " down"));
}

}  // namespace shardline::testing
