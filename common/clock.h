// A clock passed into whatever keeps time, so timeouts can be tested without sleeping.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace shardline {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::steady_clock::time_point;

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic time; thread-safe.
  virtual TimePoint Now() const = 0;
};

class SteadyClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  static SteadyClock* Get() {
    static SteadyClock clock;
    return &clock;
  }
};

// A clock that moves only when told to; thread-safe.
class ManualClock final : public Clock {
 public:
  TimePoint Now() const override { return TimePoint(Duration(now_ns_.load())); }
  void Advance(Duration d) { now_ns_ += d.count(); }

 private:
  std::atomic<int64_t> now_ns_{1'000'000'000};
};

inline double Seconds(Duration d) { return std::chrono::duration<double>(d).count(); }

// Milliseconds since the Unix epoch, for timestamps shown to people.
inline int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace shardline
