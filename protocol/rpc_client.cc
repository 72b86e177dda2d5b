#include "protocol/rpc_client.h"

#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace shardline::protocol {

absl::StatusOr<std::unique_ptr<RpcClient>> RpcClient::Connect(const std::string& endpoint,
                                                              std::string cluster_id,
                                                              std::string sender,
                                                              const ClientCurve* curve,
                                                              WireObserver* observer) {
  ASSIGN_OR_RETURN(auto channel, Channel::Connect(endpoint, curve));
  return std::unique_ptr<RpcClient>(
      new RpcClient(std::move(channel), std::move(cluster_id), std::move(sender), observer));
}

RpcClient::RpcClient(std::unique_ptr<Channel> channel, std::string cluster_id, std::string sender,
                     WireObserver* observer)
    : channel_(std::move(channel)),
      cluster_id_(std::move(cluster_id)),
      sender_(std::move(sender)),
      observer_(observer) {}

std::unique_ptr<Outgoing> RpcClient::NewMessage() {
  auto message = std::make_unique<Outgoing>(cluster_id_, sender_, 0);
  if (!actor_token_.empty()) message->envelope().setActorToken(AsData(actor_token_));
  return message;
}

absl::Status RpcClient::Notify(Outgoing& message) {
  message.envelope().setRequestId(0);
  if (observer_) observer_->OnSent(PayloadName(message.envelope().getPayload().which()));
  return channel_->Send(message);
}

absl::StatusOr<uint64_t> RpcClient::Send(Outgoing& message) {
  const uint64_t request_id = next_request_id_++;
  message.envelope().setRequestId(request_id);
  if (observer_) observer_->OnSent(PayloadName(message.envelope().getPayload().which()));
  RETURN_IF_ERROR(channel_->Send(message));
  return request_id;
}

absl::StatusOr<std::unique_ptr<Message>> RpcClient::Call(Outgoing& message,
                                                         std::chrono::milliseconds timeout) {
  const auto what = PayloadName(message.envelope().getPayload().which());
  ASSIGN_OR_RETURN(const uint64_t request_id, Send(message));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      const std::string& handshake = channel_->handshake_failure();
      return absl::DeadlineExceededError(
          "no reply to " + std::string(what) + " from " + channel_->endpoint() + " within " +
          std::to_string(timeout.count()) + " ms " +
          (handshake.empty() ? "(is the coordinator running and reachable?)"
                             : "(" + handshake + ")"));
    }
    ASSIGN_OR_RETURN(auto reply, ReceiveOne(left));
    if (channel_->handshake_refused()) {
      return absl::UnauthenticatedError(channel_->handshake_failure());
    }
    if (!reply) continue;
    if (reply->request_id() == request_id) {
      if (reply->which() == wire::Envelope::Payload::ERROR) {
        return ErrorToStatus(reply->envelope().getPayload().getError());
      }
      return reply;
    }
    // Pushes wait for NextMessage(); a late reply to a call that gave up has nobody to go to.
    if (reply->request_id() == 0) pushes_.push_back(std::move(reply));
  }
}

absl::StatusOr<std::unique_ptr<Message>> RpcClient::NextMessage(
    std::chrono::milliseconds timeout) {
  if (!pushes_.empty()) {
    auto next = std::move(pushes_.front());
    pushes_.pop_front();
    return next;
  }
  return ReceiveOne(timeout);
}

absl::StatusOr<std::unique_ptr<Message>> RpcClient::ReceiveOne(std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(auto frame, channel_->Receive(timeout));
  if (!frame) return std::unique_ptr<Message>();
  auto decoded = Decode(frame->bytes.data(), frame->bytes.size(), cluster_id_);
  if (!decoded.ok()) {
    if (observer_) observer_->OnDecodeError(DecodeFailureName(decoded.failure));
    spdlog::warn("dropping a frame from {}: {}", channel_->endpoint(),
                 ToString(decoded.status.message()));
    return std::unique_ptr<Message>();
  }
  if (observer_) observer_->OnReceived(PayloadName(decoded.message->which()));
  return std::move(decoded.message);
}

}  // namespace shardline::protocol
