// Slow, self-contained work off the coordinator's event loop — today, reading and hashing a
// checkpoint before a job resumes from it — so that heartbeats, the store and every other job are
// served meanwhile. One thread runs the tasks in order; each returns a closure that the loop runs
// later (RunFinished), so a task touches no coordinator state and the loop alone changes it.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace shardline::coordinator {

class BackgroundWork {
 public:
  using Finish = std::function<void()>;
  using Task = std::function<Finish()>;

  BackgroundWork();
  // Waits for the task that is running; tasks not yet started are dropped, with their closures.
  ~BackgroundWork();
  BackgroundWork(const BackgroundWork&) = delete;
  BackgroundWork& operator=(const BackgroundWork&) = delete;

  // `task` runs on the background thread; the closure it returns runs in a later RunFinished.
  // Thread-safe.
  void Post(Task task);
  // Runs the closures of the tasks finished so far, on the calling thread (the event loop's).
  void RunFinished();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  std::deque<Finish> finished_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace shardline::coordinator
