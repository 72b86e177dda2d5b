#include "worker/comm/communicator.h"

namespace shardline::comm {

std::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

HostSplit Communicator::host_split() {
  return HostSplit{.local = nullptr,
                   .cross = this,
                   .host = rank(),
                   .hosts = size(),
                   .local_rank = 0,
                   .local_size = 1};
}

std::string DescribeOperation(std::string_view op, size_t count, DType dtype, int rank, int size) {
  return std::string(op) + " of " + std::to_string(count) + " " + std::string(DTypeName(dtype)) +
         " on rank " + std::to_string(rank) + " of " + std::to_string(size);
}

}  // namespace shardline::comm
