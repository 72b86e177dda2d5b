#include "worker/actor/report_queue.h"

#include <future>

#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace shardline::actor {

absl::StatusOr<std::unique_ptr<ReportQueue>> ReportQueue::Connect(
    const std::string& endpoint, const std::string& cluster_id, const std::string& sender,
    const protocol::ClientCurve* curve, const std::string& actor_token,
    protocol::WireObserver* observer, std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(auto client,
                   protocol::RpcClient::Connect(endpoint, cluster_id, sender, curve, observer));
  client->set_actor_token(actor_token);
  return std::unique_ptr<ReportQueue>(new ReportQueue(std::move(client), timeout));
}

ReportQueue::ReportQueue(std::unique_ptr<protocol::RpcClient> client,
                         std::chrono::milliseconds timeout)
    : client_(std::move(client)), timeout_(timeout), thread_([this] { Loop(); }) {}

ReportQueue::~ReportQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ReportQueue::Post(std::string what, Fill fill) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Report{std::move(what), std::move(fill), nullptr});
  }
  cv_.notify_all();
}

absl::Status ReportQueue::Call(Fill fill) {
  std::promise<absl::Status> result;
  std::future<absl::Status> done = result.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Report{"", std::move(fill),
                            [&result](absl::Status status) { result.set_value(std::move(status)); }});
  }
  cv_.notify_all();
  return done.get();  // every report is answered within its deadline, or fails
}

void ReportQueue::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !sending_; });
}

void ReportQueue::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and everything sent
    Report report = std::move(queue_.front());
    queue_.pop_front();
    sending_ = true;
    lock.unlock();
    auto message = client_->NewMessage();
    report.fill(message->payload());
    const absl::Status status = client_->Call(*message, timeout_).status();
    if (report.done) {
      report.done(status);
    } else if (!status.ok()) {
      spdlog::warn("{}: {}", report.what, ToString(status.message()));
    }
    lock.lock();
    sending_ = false;
    cv_.notify_all();
  }
}

}  // namespace shardline::actor
