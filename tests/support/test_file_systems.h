// File systems for tests of checkpoint writers (checkpoint/file_system.h), each over the real one:
// one that holds every write of a shard file until the test opens a gate (a slow disk, without
// timing), and one that ends the process at its N-th operation (kill -9 at that point of a save).
#pragma once

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "checkpoint/file_system.h"

namespace shardline::testing {

// Forwards to the real file system; the hooks run before each operation.
class ForwardingFileSystem : public checkpoint::FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<checkpoint::WritableFile>> NewAtomicFile(
      const std::string& path) override {
    Before("open " + path);
    absl::StatusOr<std::unique_ptr<checkpoint::WritableFile>> file =
        checkpoint::DefaultFileSystem().NewAtomicFile(path);
    if (!file.ok()) return file.status();
    return std::unique_ptr<checkpoint::WritableFile>(
        new File(*this, path, std::move(*file)));
  }
  absl::Status CreateDirectories(const std::string& path) override {
    Before("mkdir " + path);
    return checkpoint::DefaultFileSystem().CreateDirectories(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    Before("rename " + from);
    return checkpoint::DefaultFileSystem().Rename(from, to);
  }
  absl::Status RemoveAll(const std::string& path) override {
    Before("remove " + path);
    return checkpoint::DefaultFileSystem().RemoveAll(path);
  }

 protected:
  // Called before every operation, with what it is; `path` is the file a write goes to.
  virtual void Before(const std::string& what) = 0;
  virtual void BeforeAppend(const std::string& path) { Before("append " + path); }

 private:
  class File : public checkpoint::WritableFile {
   public:
    File(ForwardingFileSystem& fs, std::string path, std::unique_ptr<checkpoint::WritableFile> file)
        : fs_(fs), path_(std::move(path)), file_(std::move(file)) {}
    absl::Status Append(std::span<const std::byte> data) override {
      fs_.BeforeAppend(path_);
      return file_->Append(data);
    }
    absl::Status Commit() override {
      fs_.Before("commit " + path_);
      return file_->Commit();
    }

   private:
    ForwardingFileSystem& fs_;
    std::string path_;
    std::unique_ptr<checkpoint::WritableFile> file_;
  };
};

// Holds every write to a rank file ("rank-*.safetensors") until Open(); counts the writes that
// are waiting. Everything else passes.
class GatedFileSystem final : public ForwardingFileSystem {
 public:
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // Whether a write is held at the gate right now.
  bool Holding() const { return holding_.load() > 0; }

 protected:
  void Before(const std::string&) override {}
  void BeforeAppend(const std::string& path) override {
    if (path.find("rank-") == std::string::npos) return;
    std::unique_lock<std::mutex> lock(mu_);
    ++holding_;
    cv_.wait(lock, [&] { return open_; });
    --holding_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  std::atomic<int> holding_{0};
};

// Ends the process with kCrashExit, as kill -9 would (no destructor, no flush), just before its
// `crash_at`-th operation (1-based); until then it counts them. Thread-safe.
class CrashingFileSystem final : public ForwardingFileSystem {
 public:
  static constexpr int kCrashExit = 86;
  explicit CrashingFileSystem(int crash_at) : crash_at_(crash_at) {}
  int operations() const { return count_.load(); }

 protected:
  void Before(const std::string&) override {
    if (++count_ == crash_at_) ::_exit(kCrashExit);
  }

 private:
  const int crash_at_;
  std::atomic<int> count_{0};
};

}  // namespace shardline::testing
