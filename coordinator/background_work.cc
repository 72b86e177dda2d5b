#include "coordinator/background_work.h"

#include <utility>

namespace shardline::coordinator {

BackgroundWork::BackgroundWork() : thread_([this] { Loop(); }) {}

BackgroundWork::~BackgroundWork() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    tasks_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

void BackgroundWork::Post(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void BackgroundWork::RunFinished() {
  std::deque<Finish> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished.swap(finished_);
  }
  for (Finish& finish : finished) {
    if (finish) finish();
  }
}

void BackgroundWork::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
    if (stop_) return;
    Task task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    Finish finish = task();
    lock.lock();
    finished_.push_back(std::move(finish));
  }
}

}  // namespace shardline::coordinator
