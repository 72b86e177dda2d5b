// Request/reply over a DEALER channel to the coordinator, for agents, actors and the CLI.
// Not thread-safe: one thread owns a client.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "protocol/channel.h"
#include "protocol/envelope.h"
#include "protocol/wire_observer.h"

namespace shardline::protocol {

class RpcClient {
 public:
  // Connects to the coordinator at `endpoint`. `sender` names this peer in every envelope.
  // `curve`: this process's CURVE identity and the coordinator's key (null: plain, --insecure).
  static absl::StatusOr<std::unique_ptr<RpcClient>> Connect(const std::string& endpoint,
                                                            std::string cluster_id,
                                                            std::string sender,
                                                            const ClientCurve* curve,
                                                            WireObserver* observer = nullptr);

  // A new envelope addressed from this client; set its payload, then Call or Notify it.
  std::unique_ptr<Outgoing> NewMessage();
  // An actor's per-generation token (Envelope.actorToken), carried by every NewMessage from now.
  void set_actor_token(std::string token) { actor_token_ = std::move(token); }

  // Sends `message` with a fresh request id and waits up to `timeout` for the reply to it. An
  // Error reply comes back as its Status; no reply is DeadlineExceeded naming the coordinator
  // (and a failed handshake, if there was one); a coordinator that refused this process's key
  // (or its lack of one) is Unauthenticated at once, with the reason.
  // Unsolicited messages that arrive meanwhile are kept for NextPush().
  absl::StatusOr<std::unique_ptr<Message>> Call(Outgoing& message,
                                                std::chrono::milliseconds timeout);

  // Sends `message` with request id 0: the receiver answers nothing.
  absl::Status Notify(Outgoing& message);

  // Sends `message` with a fresh request id without waiting; returns the id. Its reply comes
  // back through NextMessage(): for event loops that must not block (the agent).
  absl::StatusOr<uint64_t> Send(Outgoing& message);

  // The next message of any kind (pushes kept by Call first), waiting up to `timeout`; nullptr
  // when none came. Frames that fail to decode are counted, logged and dropped.
  absl::StatusOr<std::unique_ptr<Message>> NextMessage(std::chrono::milliseconds timeout);

  const std::string& endpoint() const { return channel_->endpoint(); }
  // The channel's last failed handshake (Channel::handshake_failure()); empty when none.
  const std::string& handshake_failure() const { return channel_->handshake_failure(); }
  const std::string& sender() const { return sender_; }

 private:
  RpcClient(std::unique_ptr<Channel> channel, std::string cluster_id, std::string sender,
            WireObserver* observer);
  // Receives and decodes one frame; nullptr when none within `timeout` or it was refused.
  absl::StatusOr<std::unique_ptr<Message>> ReceiveOne(std::chrono::milliseconds timeout);

  std::unique_ptr<Channel> channel_;
  std::string cluster_id_;
  std::string sender_;
  WireObserver* observer_;
  uint64_t next_request_id_ = 1;
  std::string actor_token_;
  std::deque<std::unique_ptr<Message>> pushes_;
};

}  // namespace shardline::protocol
