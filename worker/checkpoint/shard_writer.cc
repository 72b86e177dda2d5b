#include "worker/checkpoint/shard_writer.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "checkpoint/safetensors_writer.h"
#include "common/status_macros.h"

namespace shardline::worker {
namespace {

constexpr int kWriterNice = 10;

}  // namespace

ShardPlan MakeShardPlan(const std::vector<model::StatePiece>& pieces) {
  ShardPlan plan;
  std::map<std::string, int> boxes_of;  // boxes already placed per global tensor
  for (const model::StatePiece& piece : pieces) {
    StagedPiece staged;
    staged.piece = piece;
    staged.name = checkpoint::StateTensorName(piece.kind, piece.param);
    const int k = boxes_of[staged.name]++;
    staged.tensor = k == 0 ? staged.name : absl::StrCat(staged.name, ":", k);
    staged.offset = plan.floats;
    plan.floats += piece.numel;
    plan.pieces.push_back(std::move(staged));
  }
  return plan;
}

AsyncShardWriter::AsyncShardWriter(ShardPlan plan, int64_t rank, checkpoint::FileSystem& fs,
                                   OnWritten on_written)
    : plan_(std::move(plan)),
      rank_(rank),
      fs_(fs),
      on_written_(std::move(on_written)),
      staging_(static_cast<size_t>(plan_.floats)),
      thread_([this] { Loop(); }) {}

AsyncShardWriter::~AsyncShardWriter() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !job_.has_value(); });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

absl::Status AsyncShardWriter::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !job_.has_value(); });
  return std::exchange(error_, absl::OkStatus());
}

absl::Status AsyncShardWriter::PollError() {
  std::lock_guard<std::mutex> lock(mu_);
  if (job_.has_value()) return absl::OkStatus();
  return std::exchange(error_, absl::OkStatus());
}

absl::Status AsyncShardWriter::Start(int64_t step, std::string step_dir) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (job_.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "saving step ", step, ": the save of step ", job_->step, " is still being written"));
    }
    job_ = Job{step, std::move(step_dir)};
  }
  cv_.notify_all();
  return absl::OkStatus();
}

void AsyncShardWriter::Loop() {
  // Training comes first: the writer has until the next save to finish, and on a machine whose
  // cores the training threads fill, an even share for it slows every step it overlaps. A nice
  // of 10 gives it about a tenth of a busy core (the kernel's weights), all of an idle one.
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), kWriterNice);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || job_.has_value(); });
    if (!job_.has_value()) return;  // stop_, nothing in flight
    const Job job = *job_;
    lock.unlock();
    absl::Status status = Write(job.step, job.step_dir);
    lock.lock();
    error_ = Annotate(status, absl::StrCat("saving rank ", rank_, "'s shard of step ", job.step));
    job_.reset();
    cv_.notify_all();
  }
}

absl::Status AsyncShardWriter::Write(int64_t step, const std::string& step_dir) {
  checkpoint::SavedShard saved;
  saved.rank = rank_;
  if (!plan_.pieces.empty()) {
    saved.file = checkpoint::ShardFileName(rank_);
    RETURN_IF_ERROR(fs_.CreateDirectories(step_dir));
    checkpoint::SafetensorsWriter writer((std::filesystem::path(step_dir) / saved.file).string());
    // Informational: a safetensors reader that does not know our manifests sees whose file it is.
    writer.SetMetadata("format", "shardline-shard");
    writer.SetMetadata("rank", std::to_string(rank_));
    writer.SetMetadata("step", std::to_string(step));
    for (const StagedPiece& staged : plan_.pieces) {
      const std::span<const float> values(staging_.data() + staged.offset,
                                          static_cast<size_t>(staged.piece.numel));
      RETURN_IF_ERROR(writer.Add(checkpoint::TensorView{staged.tensor,
                                                        checkpoint::SafetensorsDType::kF32,
                                                        staged.piece.box.shape,
                                                        std::as_bytes(values)}));
    }
    ASSIGN_OR_RETURN(const checkpoint::SafetensorsWriter::Written written, writer.Finish(fs_));
    saved.bytes = written.bytes;
    saved.xxh3 = written.xxh3;
    for (const StagedPiece& staged : plan_.pieces) {
      saved.pieces.push_back(checkpoint::SavedPiece{
          staged.name, staged.tensor, checkpoint::SafetensorsDType::kF32,
          staged.piece.global_shape, staged.piece.box.offsets, staged.piece.box.shape,
          written.tensor_xxh3.at(staged.tensor)});
    }
  }
  return on_written_ ? on_written_(step, saved) : absl::OkStatus();
}

}  // namespace shardline::worker
