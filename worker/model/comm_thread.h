// The thread that drives the data-parallel communicator (a communicator is driven by one thread):
// the engine queues reductions and gathers on it as units of the backward finish, so they overlap
// the rest of the pass, and waits for them only where it needs their results.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/status/status.h"

namespace shardline::model {

// Tasks run in order; after one fails the rest are skipped, and Drain returns the first error.
// Submit and Drain are for one caller thread.
class CommThread {
 public:
  using Task = std::function<absl::Status()>;
  // At most `max_queued` tasks wait at a time: Submit blocks past that, which bounds the memory
  // of ZeRO 2/3's gradient buffers waiting to be reduced.
  explicit CommThread(size_t max_queued) : max_queued_(max_queued), thread_([this] { Loop(); }) {}
  ~CommThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void Submit(Task task) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return tasks_.size() < max_queued_; });
    tasks_.push_back(std::move(task));
    cv_.notify_all();
  }

  // Waits until every submitted task has run; returns (and clears) the first error.
  absl::Status Drain() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return tasks_.empty() && !running_; });
    absl::Status error = std::move(error_);
    error_ = absl::OkStatus();
    return error;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stop_ and nothing left
      Task task = std::move(tasks_.front());
      tasks_.pop_front();
      running_ = true;
      const bool failed = !error_.ok();
      lock.unlock();
      absl::Status status = failed ? absl::OkStatus() : task();
      task = nullptr;  // free what the task held outside the lock
      lock.lock();
      running_ = false;
      if (!status.ok() && error_.ok()) error_ = std::move(status);
      cv_.notify_all();
    }
  }

  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool running_ = false;
  bool stop_ = false;
  absl::Status error_;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace shardline::model
