// Writing one rank's shard of a checkpoint step without stopping training for the disk: the
// training loop copies its state into a host staging buffer (the only stall), and a thread of the
// writer's own writes that buffer as a safetensors file (checksums taken as the bytes go out),
// commits it (fsync, rename) and reports it. A new save waits for the previous one, so one staging
// buffer serves every save.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "checkpoint/commit.h"
#include "checkpoint/file_system.h"
#include "worker/model/state_piece.h"

namespace shardline::worker {

// Where one piece sits in the staging buffer and in the file.
struct StagedPiece {
  model::StatePiece piece;
  std::string name;    // the global tensor (checkpoint::StateTensorName)
  std::string tensor;  // its name in the file: `name`, or "name:k" for the k-th box of a tensor
                       // that one rank stores in several boxes
  int64_t offset = 0;  // in floats, into the staging buffer
};

// The pieces a rank saves at every save of a run, laid out back to back in their order.
struct ShardPlan {
  std::vector<StagedPiece> pieces;
  int64_t floats = 0;
};
ShardPlan MakeShardPlan(const std::vector<model::StatePiece>& pieces);

//
// In place (the memory tier's saves into a tmpfs, InPlace()), the staging buffer is the file
// itself: each save's file is one of kInPlaceSlots files of the writer's that stay mapped for its
// life, renamed from the step folder of the save kInPlaceSlots saves before into the new one
// (Prepare). The loop copies its state straight into it, and the thread only hashes it and renames
// it into place. Why: writing a fresh tmpfs file allocates and zeroes every page and copies the
// state a second time; on a 2-core Zen 4 that made memory steps every step cost 10.7% of
// bench/memory_tier_bench's step, where the copy alone costs some 3%. The data section is in
// plan order (SafetensorsWriter::KeepAddedOrder), so plan offsets are file offsets.
class AsyncShardWriter {
 public:
  // Runs on the writer's thread after a file is committed, with what to report (a rank with
  // nothing to write reports a shard without a file); an error fails the save. Must not block for
  // long: the next save waits for it.
  using OnWritten = std::function<absl::Status(int64_t step, const checkpoint::SavedShard&)>;

  // `fs` must outlive the writer. Allocates the staging buffer (plan.floats) and starts the thread.
  AsyncShardWriter(ShardPlan plan, int64_t rank, checkpoint::FileSystem& fs, OnWritten on_written);
  // The in-place writer: no staging buffer until Prepare. Its files are the caller's to remove
  // (the memory tier prunes them); a save's step folder must be on a file system that maps files
  // (a tmpfs: the writer does not fsync).
  static constexpr int kInPlaceSlots = 3;
  static std::unique_ptr<AsyncShardWriter> InPlace(ShardPlan plan, int64_t rank,
                                                   OnWritten on_written);
  // Waits for a save in flight: a started save is never abandoned halfway by us.
  ~AsyncShardWriter();
  AsyncShardWriter(const AsyncShardWriter&) = delete;
  AsyncShardWriter& operator=(const AsyncShardWriter&) = delete;

  // Waits until no save is in flight, and returns (and forgets) the error of the last one, if it
  // failed. Afterwards the staging buffer is the caller's to fill.
  absl::Status WaitIdle();
  // The error of a save that has finished and failed, without waiting; OK otherwise.
  absl::Status PollError();
  // The staging buffer: MakeShardPlan's pieces, back to back.
  std::span<float> staging() { return in_place_ ? mapped_staging_ : std::span<float>(staging_); }
  const ShardPlan& plan() const { return plan_; }

  // Hands the filled staging buffer to the thread, to be written as step `step`'s shard into
  // `step_dir`. FailedPrecondition, starting nothing, while a save is in flight (WaitIdle first).
  absl::Status Start(int64_t step, std::string step_dir);

  // In place only: waits for the save in flight, then makes staging() the data of the next
  // save's file in `step_dir` (under a temporary name until the save commits it): the oldest
  // slot's file, renamed there, or a new one. Fill it, then Start with the same folder.
  absl::Status Prepare(const std::string& step_dir);
  // In place only, inside on_written: the whole file just committed.
  std::span<const std::byte> file_bytes() const;

 private:
  struct InPlaceTag {};
  AsyncShardWriter(ShardPlan plan, int64_t rank, OnWritten on_written, InPlaceTag);
  void Loop();
  absl::Status Write(int64_t step, const std::string& step_dir);
  absl::Status Commit(int64_t step, const std::string& step_dir);  // in place

  // In place: a file of this rank's, mapped whole.
  struct Slot {
    int fd = -1;
    std::byte* map = nullptr;
    std::string path;  // where it is now
  };
  void Drop(Slot& slot);
  const bool in_place_ = false;
  std::string header_region_;  // in place: every file's header
  size_t file_size_ = 0;
  Slot slots_[kInPlaceSlots];
  int64_t saves_ = 0;         // in place: saves prepared; the next takes slots_[saves_ % kSlots]
  Slot* prepared_ = nullptr;  // the slot Prepare made ready
  std::span<float> mapped_staging_;

  const ShardPlan plan_;
  const int64_t rank_;
  checkpoint::FileSystem& fs_;
  const OnWritten on_written_;
  std::vector<float> staging_;

  std::mutex mu_;
  std::condition_variable cv_;
  struct Job {
    int64_t step = 0;
    std::string step_dir;
  };
  std::optional<Job> job_;  // the save in flight
  absl::Status error_;      // of the last finished save
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace shardline::worker
