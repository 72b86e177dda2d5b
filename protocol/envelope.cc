#include "protocol/envelope.h"

#include <cstring>

#include <capnp/dynamic.h>
#include <capnp/schema.h>
#include <kj/debug.h>
#include <kj/exception.h>

namespace shardline::protocol {
namespace {

// Bounds on what a frame may make the decoder walk: a message is at most kMaxFrameBytes, and no
// schema of ours nests deeper than a few levels.
capnp::ReaderOptions BoundedOptions() {
  capnp::ReaderOptions options;
  // Decode reads every word twice: once without the schema, once with it (CheckAgainstSchema).
  options.traversalLimitInWords = 2 * kMaxFrameBytes / sizeof(capnp::word);
  options.nestingLimit = 16;
  return options;
}

// `elements_left` bounds the list elements visited: a list of zero-sized structs may claim 2^29
// elements in one word, which Cap'n Proto's traversal limit does not count, and a frame's lists
// cannot hold more elements than it has words.
void CheckValue(const capnp::DynamicValue::Reader& value, uint64_t& elements_left);

void CheckStruct(const capnp::DynamicStruct::Reader& reader, uint64_t& elements_left) {
  for (const capnp::StructSchema::Field field : reader.getSchema().getNonUnionFields()) {
    if (reader.has(field)) CheckValue(reader.get(field), elements_left);
  }
  KJ_IF_MAYBE (field, reader.which()) {
    if (reader.has(*field)) CheckValue(reader.get(*field), elements_left);
  }
}

void CheckValue(const capnp::DynamicValue::Reader& value, uint64_t& elements_left) {
  switch (value.getType()) {
    case capnp::DynamicValue::STRUCT:
      CheckStruct(value.as<capnp::DynamicStruct>(), elements_left);
      break;
    case capnp::DynamicValue::LIST: {
      const auto list = value.as<capnp::DynamicList>();
      switch (list.getSchema().whichElementType()) {
        case capnp::schema::Type::TEXT:
        case capnp::schema::Type::DATA:
        case capnp::schema::Type::LIST:
        case capnp::schema::Type::STRUCT:
          KJ_REQUIRE(list.size() <= elements_left,
                     "the frame's lists hold more elements than the frame has words");
          elements_left -= list.size();
          for (const capnp::DynamicValue::Reader element : list) {
            CheckValue(element, elements_left);
          }
          break;
        default:  // numbers, booleans and enums: any bits are a value
          break;
      }
      break;
    }
    default:  // getting a text (NUL-terminated) or data already checked it
      break;
  }
}

// Reads every field the schema knows, the way a handler would: a pointer of the wrong kind (a
// list where a struct is due) or an unterminated text throws here, so that a frame Decode accepts
// can be read field by field without an exception. totalSize() alone checks only bounds.
void CheckAgainstSchema(wire::Envelope::Reader envelope, size_t words) {
  uint64_t elements_left = words;
  CheckStruct(capnp::DynamicStruct::Reader(envelope), elements_left);
}

DecodeResult Refuse(DecodeFailure failure, std::string message, uint64_t request_id = 0) {
  DecodeResult result;
  result.failure = failure;
  const bool precondition = failure == DecodeFailure::kVersion || failure == DecodeFailure::kCluster;
  result.status = precondition ? absl::FailedPreconditionError(std::move(message))
                               : absl::InvalidArgumentError(std::move(message));
  result.request_id = request_id;
  return result;
}

}  // namespace

std::string_view DecodeFailureName(DecodeFailure failure) {
  switch (failure) {
    case DecodeFailure::kNone: return "none";
    case DecodeFailure::kTruncated: return "truncated";
    case DecodeFailure::kGarbage: return "garbage";
    case DecodeFailure::kOversized: return "oversized";
    case DecodeFailure::kVersion: return "version";
    case DecodeFailure::kCluster: return "cluster";
  }
  return "unknown";
}

DecodeResult Decode(const void* data, size_t size, std::string_view expected_cluster) {
  if (size > kMaxFrameBytes) {
    return Refuse(DecodeFailure::kOversized, "frame of " + std::to_string(size) +
                                                 " bytes exceeds the limit of " +
                                                 std::to_string(kMaxFrameBytes));
  }
  if (size < 16 || size % sizeof(capnp::word) != 0) {
    return Refuse(DecodeFailure::kTruncated,
                  "frame of " + std::to_string(size) + " bytes is not a whole Cap'n Proto message");
  }
  auto message = std::make_unique<Message>();
  // ZeroMQ gives no alignment guarantee; Cap'n Proto needs word alignment.
  message->words_ = kj::heapArray<capnp::word>(size / sizeof(capnp::word));
  std::memcpy(message->words_.begin(), data, size);
  try {
    // The segment table must account for exactly the bytes we got: fewer means truncated.
    const size_t expected_words = capnp::expectedSizeInWordsFromPrefix(message->words_.asPtr());
    if (expected_words > message->words_.size()) {
      return Refuse(DecodeFailure::kTruncated,
                    "frame holds " + std::to_string(size) + " bytes but its header announces " +
                        std::to_string(expected_words * sizeof(capnp::word)));
    }
    message->reader_ =
        std::make_unique<capnp::FlatArrayMessageReader>(message->words_.asPtr(), BoundedOptions());
    message->envelope_ = message->reader_->getRoot<wire::Envelope>();
    // Walks every pointer once, so that a malformed message fails here and not in a handler.
    (void)message->envelope_.totalSize();
  } catch (const kj::Exception& e) {
    return Refuse(DecodeFailure::kGarbage,
                  std::string("malformed message: ") + e.getDescription().cStr());
  }
  const auto envelope = message->envelope_;
  const uint64_t request_id = envelope.getRequestId();
  if (envelope.getProtocolVersion() != wire::PROTOCOL_VERSION) {
    return Refuse(DecodeFailure::kVersion,
                  "protocol version " + std::to_string(envelope.getProtocolVersion()) +
                      " is not supported (this peer speaks version " +
                      std::to_string(wire::PROTOCOL_VERSION) + ")",
                  request_id);
  }
  try {
    // Both header texts are read here even when no cluster is expected: totalSize() does not
    // check that a text ends in its NUL, and every receiver logs the sender and cluster.
    const std::string cluster = Str(envelope.getClusterId());
    (void)envelope.getSender().cStr();
    if (!expected_cluster.empty() && cluster != expected_cluster) {
      return Refuse(DecodeFailure::kCluster,
                    "message for cluster '" + cluster + "' reached cluster '" +
                        std::string(expected_cluster) + "'",
                    request_id);
    }
  } catch (const kj::Exception& e) {
    return Refuse(DecodeFailure::kGarbage,
                  std::string("malformed header: ") + e.getDescription().cStr(), request_id);
  }
  // After the version check: a peer of another version gets that reason, not "malformed".
  try {
    CheckAgainstSchema(envelope, size / sizeof(capnp::word));
  } catch (const kj::Exception& e) {
    return Refuse(DecodeFailure::kGarbage,
                  std::string(PayloadName(envelope.getPayload().which())) +
                      " payload is malformed: " + e.getDescription().cStr(),
                  request_id);
  }
  DecodeResult result;
  result.request_id = request_id;
  result.message = std::move(message);
  return result;
}

Outgoing::Outgoing(std::string_view cluster_id, std::string_view sender, uint64_t request_id)
    : envelope_(builder_.initRoot<wire::Envelope>()) {
  envelope_.setProtocolVersion(wire::PROTOCOL_VERSION);
  envelope_.setClusterId(capnp::Text::Reader(cluster_id.data(), cluster_id.size()));
  envelope_.setSender(capnp::Text::Reader(sender.data(), sender.size()));
  envelope_.setRequestId(request_id);
}

std::string_view PayloadName(wire::Envelope::Payload::Which which) {
  using W = wire::Envelope::Payload::Which;
  switch (which) {
    case W::ERROR: return "error";
    case W::ACK: return "ack";
    case W::REGISTER_NODE: return "register_node";
    case W::REGISTER_NODE_REPLY: return "register_node_reply";
    case W::HEARTBEAT: return "heartbeat";
    case W::SUBMIT_JOB: return "submit_job";
    case W::SUBMIT_JOB_REPLY: return "submit_job_reply";
    case W::STATUS_REQUEST: return "status_request";
    case W::CLUSTER_STATUS: return "cluster_status";
    case W::CANCEL_JOB: return "cancel_job";
    case W::SPAWN_ACTORS: return "spawn_actors";
    case W::ABORT_GENERATION: return "abort_generation";
    case W::ACTOR_EXITED: return "actor_exited";
    case W::REGISTER_ACTOR: return "register_actor";
    case W::ASSIGNMENT: return "assignment";
    case W::KV_REQUEST: return "kv_request";
    case W::KV_REPLY: return "kv_reply";
    case W::COMM_READY: return "comm_ready";
    case W::COMM_FAILED: return "comm_failed";
    case W::STEP_REPORT: return "step_report";
    case W::ACTOR_DONE: return "actor_done";
    case W::SHUTDOWN: return "shutdown";
    case W::COMM_JOIN: return "comm_join";
    case W::SHARD_SAVED: return "shard_saved";
    case W::CALIBRATION: return "calibration";
  }
  return "unknown";
}

void SetError(wire::Envelope::Payload::Builder payload, const absl::Status& status) {
  auto error = payload.initError();
  error.setCode(static_cast<uint32_t>(status.code()));
  const auto message = status.message();
  error.setMessage(capnp::Text::Reader(message.data(), message.size()));
}

absl::Status ErrorToStatus(wire::Error::Reader error) {
  auto code = static_cast<absl::StatusCode>(error.getCode());
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kUnknown;
  try {
    return absl::Status(code, Str(error.getMessage()));
  } catch (const kj::Exception& e) {
    // Decode checks the structure, not that each text ends in its NUL.
    return absl::Status(code, std::string("(malformed error message: ") +
                                  e.getDescription().cStr() + ")");
  }
}

}  // namespace shardline::protocol
