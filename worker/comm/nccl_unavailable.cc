// The NCCL entry points of a build without CUDA: they exist so that callers need no #ifdef, and
// say why they cannot work.
#include "worker/comm/communicator.h"

namespace shardline::comm {
namespace {
absl::Status NoNccl(const std::string& what) {
  return absl::UnimplementedError(what + ": this build has no CUDA/NCCL");
}
}  // namespace

bool NcclBuilt() { return false; }

absl::StatusOr<std::string> ExchangeNcclUniqueId(Store&, int rank, std::chrono::milliseconds) {
  return NoNccl("NCCL unique-id exchange on rank " + std::to_string(rank));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Store&, int rank, int size,
                                                                     const NcclOptions&) {
  return NoNccl("nccl bootstrap of rank " + std::to_string(rank) + " of " + std::to_string(size));
}

}  // namespace shardline::comm
