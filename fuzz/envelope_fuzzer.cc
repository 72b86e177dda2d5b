// The wire decoder (protocol/envelope.h) on arbitrary frames: Decode must refuse a bad frame
// with a reason and never throw, and a frame it accepts must be safe to read everywhere, since
// handlers read any field without catching.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_support.h"
#include "protocol/envelope.h"

namespace {

using shardline::protocol::Decode;
using shardline::protocol::DecodeFailure;
using shardline::protocol::DecodeResult;

void CheckRefusal(const DecodeResult& result) {
  FUZZ_CHECK(result.message == nullptr, "a refused frame came with a message");
  FUZZ_CHECK(result.failure != DecodeFailure::kNone, "refused without a reason");
  FUZZ_CHECK(!result.status.message().empty(), "refused without a message");
  (void)shardline::protocol::DecodeFailureName(result.failure);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const DecodeResult any_cluster = Decode(data, size, "");
  if (!any_cluster.ok()) {
    CheckRefusal(any_cluster);
    return 0;
  }
  FUZZ_CHECK(any_cluster.message != nullptr, "accepted without a message");
  const auto envelope = any_cluster.message->envelope();
  (void)shardline::protocol::PayloadName(any_cluster.message->which());
  const std::string cluster = shardline::protocol::Str(envelope.getClusterId());
  const std::string sender = shardline::protocol::Str(envelope.getSender());
  if (envelope.getPayload().isError()) {
    (void)shardline::protocol::ErrorToStatus(envelope.getPayload().getError());
  }

  // The same frame addressed to its own cluster passes; to another, it is refused by name.
  if (!cluster.empty()) {
    const DecodeResult same = Decode(data, size, cluster);
    FUZZ_CHECK(same.ok(), "refused for its own cluster '" + cluster + "': " +
                              std::string(same.status.message()));
  }
  const DecodeResult other = Decode(data, size, cluster + "-other");
  FUZZ_CHECK(!other.ok() && other.failure == DecodeFailure::kCluster,
             "a frame for cluster '" + cluster + "' was not refused by another cluster");
  CheckRefusal(other);
  return 0;
}
