// Encoding and bounded decoding of the one message type on the wire, the Envelope.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "protocol/shardline.capnp.h"

namespace shardline::protocol {

// Frames larger than this are refused before decoding.
inline constexpr size_t kMaxFrameBytes = 64u << 20;

// Why a frame was refused; also the `reason` label of the decode-error metric.
enum class DecodeFailure { kNone, kTruncated, kGarbage, kOversized, kVersion, kCluster };
std::string_view DecodeFailureName(DecodeFailure failure);

struct DecodeResult;

// A decoded, fully validated envelope. Owns its (word-aligned) bytes.
class Message {
 public:
  wire::Envelope::Reader envelope() const { return envelope_; }
  wire::Envelope::Payload::Which which() const { return envelope_.getPayload().which(); }
  uint64_t request_id() const { return envelope_.getRequestId(); }

 private:
  friend DecodeResult Decode(const void* data, size_t size, std::string_view expected_cluster);
  kj::Array<capnp::word> words_;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
  wire::Envelope::Reader envelope_;
};

struct DecodeResult {
  absl::Status status;  // InvalidArgument (or FailedPrecondition for version/cluster) when refused
  DecodeFailure failure = DecodeFailure::kNone;
  std::unique_ptr<Message> message;
  // The request id, when the frame got that far: lets the receiver address an error reply.
  uint64_t request_id = 0;
  bool ok() const { return status.ok(); }
};

// Decodes one frame with bounded ReaderOptions and checks its protocol version and, unless
// `expected_cluster` is empty, its cluster id; then reads every field the schema knows once, so
// that reading an accepted message's fields does not throw (a frame whose pointers do not match
// the schema, or with an unterminated text, is refused as kGarbage). Never throws.
DecodeResult Decode(const void* data, size_t size, std::string_view expected_cluster);

// An envelope being built: header filled in, payload to be set by the caller.
class Outgoing {
 public:
  Outgoing(std::string_view cluster_id, std::string_view sender, uint64_t request_id);
  wire::Envelope::Payload::Builder payload() { return envelope_.initPayload(); }
  wire::Envelope::Builder envelope() { return envelope_; }
  kj::Array<capnp::word> Serialize() { return capnp::messageToFlatArray(builder_); }

 private:
  capnp::MallocMessageBuilder builder_;
  wire::Envelope::Builder envelope_;
};

// The payload's name in snake_case ("register_node"), for logs and the messages-by-type metric.
std::string_view PayloadName(wire::Envelope::Payload::Which which);

// Writes `status` as an Error payload.
void SetError(wire::Envelope::Payload::Builder payload, const absl::Status& status);
// Reads an Error payload back as a Status.
absl::Status ErrorToStatus(wire::Error::Reader error);

// Cap'n Proto Text/Data to std::string (copying).
inline std::string Str(capnp::Text::Reader text) { return std::string(text.cStr(), text.size()); }
inline std::string Str(capnp::Data::Reader data) {
  return std::string(reinterpret_cast<const char*>(data.begin()), data.size());
}
inline capnp::Data::Reader AsData(std::string_view bytes) {
  return capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(bytes.data()), bytes.size());
}

}  // namespace shardline::protocol
