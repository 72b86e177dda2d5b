// The CPU communicator a group gets under `backend: shm` (what `auto` picks on CPU devices): shared
// memory when every rank is on one host, a hierarchical all-reduce when the group spans hosts with
// as many ranks on each, Gloo otherwise. The choice is collective: every rank publishes its host
// identity to the store and all apply ChooseCpuTransport to the same list, so no rank can pick a
// transport its peers did not.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/comm/shm_communicator.h"

namespace shardline::comm {

enum class CpuTransport { kShm, kHierarchical, kGloo };
std::string_view CpuTransportName(CpuTransport transport);  // "shm", "shm+gloo", "gloo"

// `hosts[r]` is rank r's host identity. One host: kShm. Several hosts with the same number (at
// least 2) of ranks each: kHierarchical. Anything else (one rank per host, uneven hosts): kGloo.
CpuTransport ChooseCpuTransport(const std::vector<std::string>& hosts);

struct CpuCommOptions {
  GlooOptions gloo;
  ShmOptions shm;
  std::string host_id;  // empty: LocalHostIdentity(); tests give ranks distinct "hosts"
};

absl::StatusOr<std::unique_ptr<Communicator>> CreateCpuCommunicator(Store& store, int rank,
                                                                    int size,
                                                                    const CpuCommOptions& options);

}  // namespace shardline::comm
