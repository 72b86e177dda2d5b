#include "worker/checkpoint/shard_writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "checkpoint/checksum.h"
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

AsyncShardWriter::AsyncShardWriter(ShardPlan plan, int64_t rank, OnWritten on_written, InPlaceTag)
    : in_place_(true),
      plan_(std::move(plan)),
      rank_(rank),
      fs_(checkpoint::DefaultFileSystem()),
      on_written_(std::move(on_written)),
      thread_([this] { Loop(); }) {
  // Every file has the same header: the pieces in plan order, with the metadata a disk shard has
  // but its step (which would change the header's length; the manifest says the step).
  checkpoint::SafetensorsWriter layout("");
  layout.KeepAddedOrder();
  layout.SetMetadata("format", "shardline-shard");
  layout.SetMetadata("rank", std::to_string(rank_));
  static const float kNoData = 0;
  for (const StagedPiece& staged : plan_.pieces) {
    // The bytes are never read: the header needs only their count.
    const size_t bytes = static_cast<size_t>(staged.piece.numel) * sizeof(float);
    (void)layout.Add(checkpoint::TensorView{
        staged.tensor, checkpoint::SafetensorsDType::kF32, staged.piece.box.shape,
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(&kNoData), bytes)});
  }
  header_region_ = layout.HeaderRegion();
  file_size_ = header_region_.size() + static_cast<size_t>(plan_.floats) * sizeof(float);
}

std::unique_ptr<AsyncShardWriter> AsyncShardWriter::InPlace(ShardPlan plan, int64_t rank,
                                                            OnWritten on_written) {
  return std::unique_ptr<AsyncShardWriter>(
      new AsyncShardWriter(std::move(plan), rank, std::move(on_written), InPlaceTag{}));
}

AsyncShardWriter::~AsyncShardWriter() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !job_.has_value(); });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (Slot& slot : slots_) Drop(slot);
}

void AsyncShardWriter::Drop(Slot& slot) {
  if (slot.map != nullptr) ::munmap(slot.map, file_size_);
  if (slot.fd >= 0) ::close(slot.fd);
  slot = Slot();
}

absl::Status AsyncShardWriter::Prepare(const std::string& step_dir) {
  if (!in_place_) return absl::FailedPreconditionError("Prepare is the in-place writer's");
  RETURN_IF_ERROR(WaitIdle());
  prepared_ = nullptr;
  mapped_staging_ = {};
  if (plan_.pieces.empty()) return absl::OkStatus();  // nothing to write: no file
  RETURN_IF_ERROR(fs_.CreateDirectories(step_dir));
  const std::string path =
      (std::filesystem::path(step_dir) / (checkpoint::ShardFileName(rank_) + ".tmp")).string();
  Slot& slot = slots_[saves_ % kInPlaceSlots];
  // The slot's file holds a step kInPlaceSlots saves old; someone may have removed it (a prune of
  // an older generation's steps, the agent at the job's end): then a new one.
  if (slot.fd >= 0 && ::rename(slot.path.c_str(), path.c_str()) != 0) Drop(slot);
  if (slot.fd < 0) {
    slot.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (slot.fd < 0) {
      return absl::UnavailableError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
    }
    if (::ftruncate(slot.fd, static_cast<off_t>(file_size_)) != 0) {
      const int error = errno;
      Drop(slot);
      return absl::UnavailableError(absl::StrCat("ftruncate ", path, ": ", std::strerror(error)));
    }
    // Populated at once: one fault per page now rather than in the copy.
    void* map =
        ::mmap(nullptr, file_size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, slot.fd, 0);
    if (map == MAP_FAILED) {
      const int error = errno;
      Drop(slot);
      return absl::UnavailableError(absl::StrCat("mmap ", path, ": ", std::strerror(error)));
    }
    slot.map = static_cast<std::byte*>(map);
    std::memcpy(slot.map, header_region_.data(), header_region_.size());
  }
  slot.path = path;
  ++saves_;
  prepared_ = &slot;
  mapped_staging_ = std::span<float>(reinterpret_cast<float*>(slot.map + header_region_.size()),
                                     static_cast<size_t>(plan_.floats));
  return absl::OkStatus();
}

std::span<const std::byte> AsyncShardWriter::file_bytes() const {
  if (prepared_ == nullptr) return {};
  return std::span<const std::byte>(prepared_->map, file_size_);
}

absl::Status AsyncShardWriter::Commit(int64_t step, const std::string& step_dir) {
  checkpoint::SavedShard saved;
  saved.rank = rank_;
  if (prepared_ != nullptr) {
    saved.file = checkpoint::ShardFileName(rank_);
    const std::string path = (std::filesystem::path(step_dir) / saved.file).string();
    std::vector<uint64_t> checksums;
    for (const StagedPiece& staged : plan_.pieces) {
      const std::span<const float> values(mapped_staging_.data() + staged.offset,
                                          static_cast<size_t>(staged.piece.numel));
      checksums.push_back(checkpoint::Xxh3Of(std::as_bytes(values)));
      saved.pieces.push_back(checkpoint::SavedPiece{
          staged.name, staged.tensor, checkpoint::SafetensorsDType::kF32, staged.piece.global_shape,
          staged.piece.box.offsets, staged.piece.box.shape, checksums.back()});
    }
    if (::rename(prepared_->path.c_str(), path.c_str()) != 0) {
      return absl::UnavailableError(
          absl::StrCat("rename ", prepared_->path, " to ", path, ": ", std::strerror(errno)));
    }
    prepared_->path = path;
    saved.bytes = file_size_;
    saved.xxh3 =
        checkpoint::FileChecksum(std::as_bytes(std::span<const char>(header_region_)), checksums);
  }
  return on_written_ ? on_written_(step, saved) : absl::OkStatus();
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
  if (in_place_) return Commit(step, step_dir);
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
