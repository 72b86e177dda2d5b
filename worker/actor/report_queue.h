// Reports to the coordinator that must not hold up training: step reports from the training loop
// and the checkpoint writer's ShardSaved. One thread of the queue's own, over a connection of its
// own (an RpcClient serves one thread), sends them in the order they were posted, each a Call
// with a deadline.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "protocol/envelope.h"
#include "protocol/rpc_client.h"

namespace shardline::actor {

class ReportQueue {
 public:
  // Builds a report's payload; runs on the queue's thread.
  using Fill = std::function<void(wire::Envelope::Payload::Builder)>;

  static absl::StatusOr<std::unique_ptr<ReportQueue>> Connect(const std::string& endpoint,
                                                              const std::string& cluster_id,
                                                              const std::string& sender,
                                                              const protocol::ClientCurve* curve,
                                                              const std::string& actor_token,
                                                              protocol::WireObserver* observer,
                                                              std::chrono::milliseconds timeout);
  // Sends what is queued (each within its deadline), then stops.
  ~ReportQueue();

  // Queues a report and returns at once; a report that fails is logged as `what` and dropped.
  // Thread-safe.
  void Post(std::string what, Fill fill);
  // Queues a report behind the ones already posted and waits for its reply: its error, or OK.
  // For threads that may wait (the checkpoint writer's), never the training loop. Thread-safe.
  absl::Status Call(Fill fill);
  // Waits until every report posted so far has been sent and answered (or failed).
  void Flush();

 private:
  struct Report {
    std::string what;
    Fill fill;
    std::function<void(absl::Status)> done;  // null: log a failure
  };
  ReportQueue(std::unique_ptr<protocol::RpcClient> client, std::chrono::milliseconds timeout);
  void Loop();

  std::unique_ptr<protocol::RpcClient> client_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Report> queue_;
  bool sending_ = false;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace shardline::actor
