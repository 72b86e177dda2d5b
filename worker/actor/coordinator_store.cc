#include "worker/actor/coordinator_store.h"

#include "common/status_macros.h"

namespace shardline::actor {
namespace {

// How long a store request may wait on the coordinator beyond its own wait.
constexpr std::chrono::milliseconds kRequestSlack{5000};

}  // namespace

absl::Status CoordinatorStore::Set(const std::string& key, const std::string& value) {
  auto message = client_.NewMessage();
  auto request = message->payload().initKvRequest();
  request.setOp(wire::KvOp::SET);
  request.setKey(key);
  request.setValue(protocol::AsData(value));
  ASSIGN_OR_RETURN(auto reply, client_.Call(*message, kRequestSlack));
  (void)reply;
  return absl::OkStatus();
}

absl::StatusOr<std::string> CoordinatorStore::Get(const std::string& key,
                                                  std::chrono::milliseconds timeout) {
  auto message = client_.NewMessage();
  auto request = message->payload().initKvRequest();
  request.setOp(wire::KvOp::GET);
  request.setKey(key);
  request.setWaitMs(static_cast<uint32_t>(std::max<int64_t>(timeout.count(), 0)));
  auto reply = client_.Call(*message, timeout + kRequestSlack);
  if (!reply.ok()) {
    return Annotate(reply.status(), "store get '" + key + "'");
  }
  if ((*reply)->which() != wire::Envelope::Payload::KV_REPLY) {
    return absl::InternalError("store get '" + key + "': unexpected reply " +
                               std::string(protocol::PayloadName((*reply)->which())));
  }
  return protocol::Str((*reply)->envelope().getPayload().getKvReply().getValue());
}

absl::StatusOr<int64_t> CoordinatorStore::Add(const std::string& key, int64_t delta) {
  auto message = client_.NewMessage();
  auto request = message->payload().initKvRequest();
  request.setOp(wire::KvOp::ADD);
  request.setKey(key);
  request.setDelta(delta);
  ASSIGN_OR_RETURN(auto reply, client_.Call(*message, kRequestSlack));
  if (reply->which() != wire::Envelope::Payload::KV_REPLY) {
    return absl::InternalError("store add '" + key + "': unexpected reply");
  }
  return reply->envelope().getPayload().getKvReply().getNumber();
}

}  // namespace shardline::actor
